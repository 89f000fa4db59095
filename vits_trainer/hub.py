"""Find a model folder: a local path, or a Hugging Face hub id (downloaded or already cached)."""

from __future__ import annotations

import json
import os
import socket
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

from .errors import UserError


@cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached from here (None: it can, as far as a 3 s connect
    tells). Asked before a hub lookup, so an offline machine or a mistyped path fails at once instead
    of after the hub clients' retries (~25 s)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # behind a proxy a direct connect proves nothing: let the hub client try
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    try:
        port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        return f"this machine cannot reach {host}: {err.strerror or type(err).__name__}"
    except ValueError:
        return None  # a malformed HF_ENDPOINT: the hub client says what is wrong with it
    return None


def go_offline_if_unreachable() -> str | None:
    """With no hub in reach, tell the hub clients to use their local cache only (no retries); returns
    the reason, or None when the hub is reachable."""
    why = hub_unreachable()
    if why:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    return why


def is_repo_id(name: str) -> bool:
    """`name` is a model repo id the hub accepts: USER/NAME or ORG/NAME, by huggingface_hub's own rules."""
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except Exception:
        return False
    return name.count("/") == 1


def download_hint(name: str, what: str = "model") -> str:
    kind = "" if what == "model" else f" --repo-type {what}"
    return f"hf download {name}{kind} --local-dir DIR"


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


def _model_folders_inside(path: Path) -> str:
    """A checkpoint or output folder given for the model in it (training/checkpoints: its best_model/ and
    step_* folders; feedback_models: latest): the model folders it holds, to pass instead."""
    try:
        inside = sorted(p.name for p in path.iterdir() if p.is_dir() and (p / "config.json").is_file())
    except OSError:
        return ""
    if not inside:
        return ""
    steps = [n for n in inside if n.startswith("step_")]
    shown = [n for n in inside if not n.startswith("step_")] + steps[-1:]
    return f"; it holds model folders: pass one of them, e.g. {path / shown[0]} ({', '.join(shown)})"


def resolve_model_dir(name: str, purpose: str = "--model_name") -> Path:
    """Return a local folder holding `config.json` for `name` (a folder or a hub id).

    A hub id is looked up in the local cache first, then downloaded; with no network and no cached
    copy the error says what to pass instead.
    """
    path = Path(name).expanduser()
    if path.is_file():  # a file of the model (its config.json, its weights) given for its folder
        if (path.parent / "config.json").is_file():
            folder = path.parent if path.parent != Path(".") else Path.cwd()  # "pass ." reads as cut short
            raise UserError(f"{purpose} {name}: is a file, not a model folder: pass {folder}")
        raise UserError(
            f"{purpose} {name}: is a file, not a model folder (expected a saved VitsModel folder)"
        )
    if path.exists():
        if not (path / "config.json").is_file():
            raise UserError(
                f"{purpose} {name}: folder has no config.json (expected a saved VitsModel folder)"
                + _model_folders_inside(path)
            )
        return path
    if looks_like_path(name):
        raise UserError(f"{purpose} {name}: no such folder")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    why = hub_unreachable()
    if why:
        raise UserError(
            f"{purpose} {name}: not a local folder and could not be fetched from the Hugging Face hub "
            f"({why}; not in the local cache either). Download it on a machine with network "
            f"({download_hint(name)}) and pass {purpose} DIR"
        )
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as err:
        kind = type(err).__name__
        raise UserError(
            f"{purpose} {name}: not a local folder and could not be fetched from the Hugging Face hub "
            f"({kind}). Check the name, or download it ({download_hint(name)}) and pass {purpose} DIR"
        ) from None


def read_model_config(model_dir: Path, flag: str = "--model_name") -> dict:
    """A model folder's config.json; one error line naming `flag` when it is unreadable or no JSON object."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{flag} {model_dir}: its config.json cannot be read ({err})") from None
    if not isinstance(config, dict):
        raise UserError(
            f"{flag} {model_dir}: its config.json holds a JSON {json_kind(config)}, not a JSON object; copy "
            "the model folder again (or export it again)"
        )
    return config


def json_kind(value) -> str:
    """What a parsed JSON value is, in JSON's words (a Python type name would say 'NoneType')."""
    if isinstance(value, bool):
        return "true/false"
    kinds = {list: "list", dict: "object", str: "string", int: "number", float: "number"}
    return kinds.get(type(value), "null")
