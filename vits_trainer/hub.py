"""Find a model folder: a local path, or a Hugging Face hub id (downloaded or already cached)."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


def resolve_model_dir(name: str, purpose: str = "--model_name") -> Path:
    """Return a local folder holding `config.json` for `name` (a folder or a hub id).

    A hub id is looked up in the local cache first, then downloaded; with no network and no cached
    copy the error says what to pass instead.
    """
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UserError(
                f"{purpose} {name}: folder has no config.json (expected a saved VitsModel folder)"
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
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as err:
        kind = type(err).__name__
        raise UserError(
            f"{purpose} {name}: not a local folder and could not be fetched from the Hugging Face hub "
            f"({kind}; offline?). Download it on a machine with network (huggingface-cli download {name} "
            f"--local-dir DIR) and pass {purpose} DIR"
        ) from None


def read_model_config(model_dir: Path) -> dict:
    with open(model_dir / "config.json", encoding="utf-8") as f:
        return json.load(f)
