"""Checkpoints that are either complete or absent: atomic folders, a manifest written last, safe loading.

A checkpoint is a folder `step_00001234/` under the checkpoint dir. It is written as a hidden temp
folder, every file fsync'ed, then `manifest.json` (names, sizes, checksums) last, then renamed into
place. Resume takes the newest folder whose manifest checks out and falls back to older ones. Old
checkpoints are deleted only after `keep` newer ones pass their checksums. Nothing is ever unpickled:
tensors are safetensors, optimiser states go through `torch.load(weights_only=True)`, the rest is JSON.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes

from ..errors import UserError
from ..safety import remove_dead_writers_temp
from .checkpoint_names import checkpoint_name, list_checkpoints

try:  # xxhash comes with `datasets`; much faster than sha256 on a GB-sized checkpoint
    import xxhash

    def _digest(data: bytes) -> str:
        return "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)
except ImportError:  # pragma: no cover
    import hashlib

    def _digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()


MANIFEST = "manifest.json"


class CheckpointError(UserError):
    """A checkpoint that is incomplete or damaged. A UserError: one that escapes (e.g. a damaged
    --resume PATH found while loading) ends the run with one `error:` line, never a traceback."""


def tensors_to_bytes(state: dict[str, torch.Tensor]) -> bytes:
    return save_safetensors_bytes({k: v.detach().contiguous().cpu() for k, v in state.items()})


def bytes_to_tensors(data: bytes) -> dict[str, torch.Tensor]:
    return load_safetensors_bytes(data)


def object_to_bytes(obj) -> bytes:
    """Optimiser/scaler/RNG states: tensors, numbers, lists, dicts only (loadable with weights_only)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def bytes_to_object(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def json_bytes(obj) -> bytes:
    return json.dumps(obj, indent=1, ensure_ascii=False, default=str).encode("utf-8")


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint(
    checkpoint_dir: Path, step: int, files: dict[str, bytes], info: dict | None = None
) -> Path:
    """Write `files` as checkpoint `step`; returns the final folder. Raises OSError (e.g. disk full)
    after removing its own temp folder, leaving every earlier checkpoint untouched."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / checkpoint_name(step)
    tmp = checkpoint_dir / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)  # this pid's temp folder (name ends in our pid)
    try:
        tmp.mkdir()
        manifest = {"step": step, "created": time.time(), "info": info or {}, "files": {}}
        for name, data in files.items():
            _write(tmp / name, data)
            manifest["files"][name] = {"size": len(data), "digest": _digest(data)}
        _write(tmp / MANIFEST, json_bytes(manifest))  # last: its presence means "complete"
        _fsync_dir(tmp)
        aside = None
        if final.exists():  # the same step saved twice (e.g. a signal right after a periodic save):
            # renamed aside, not deleted first, so that no moment but one between two renames lacks it
            aside = checkpoint_dir / f".{final.name}.tmp-aside-{os.getpid()}"
            shutil.rmtree(aside, ignore_errors=True)  # this pid's name, from an earlier crash
            os.replace(final, aside)  # step_N of this run (checkpoint dir overlaps no user folder: safety.py)
        os.replace(tmp, final)
        _fsync_dir(checkpoint_dir)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: no manifest (interrupted while saving)") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path.name}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path.name}: malformed manifest")
    files = manifest.get("files")
    # every listed file needs its size and digest (verify_checkpoint and read_file read them), and a
    # resume reads the step and the time it was saved; every manifest this tool wrote has them
    if not isinstance(files, dict) or not all(
        isinstance(meta, dict) and {"size", "digest"} <= meta.keys() for meta in files.values()
    ):
        raise CheckpointError(f"{path.name}: malformed manifest")
    if type(manifest.get("step")) is not int or not isinstance(manifest.get("created"), (int, float)):
        raise CheckpointError(f"{path.name}: malformed manifest (no step or time)")
    return manifest


def verify_checkpoint(path: Path, checksums: bool = False) -> dict:
    """Return the manifest if every listed file is present with its size (and checksum); else raise."""
    manifest = read_manifest(path)
    for name, meta in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path.name}: {name} is missing")
        if file.stat().st_size != meta["size"]:
            raise CheckpointError(
                f"{path.name}: {name} has {file.stat().st_size} bytes, expected {meta['size']}"
            )
        if checksums and _digest(file.read_bytes()) != meta["digest"]:
            raise CheckpointError(f"{path.name}: {name} fails its checksum")
    return manifest


def read_file(path: Path, name: str, manifest: dict) -> bytes:
    """Read one file of a checkpoint and check it against the manifest."""
    meta = manifest["files"].get(name)
    if meta is None:
        raise CheckpointError(f"{path.name}: {name} is not in the manifest")
    data = (path / name).read_bytes()
    if len(data) != meta["size"] or _digest(data) != meta["digest"]:
        raise CheckpointError(f"{path.name}: {name} is damaged (size or checksum mismatch)")
    return data


def find_resumable(checkpoint_dir: Path, log=print) -> tuple[Path | None, dict | None]:
    """Newest checkpoint whose files all match their manifest (sizes and checksums); damaged ones are
    reported and skipped, so a resume falls back to the previous checkpoint."""
    for path in list_checkpoints(checkpoint_dir):
        try:
            return path, verify_checkpoint(path, checksums=True)
        except CheckpointError as err:
            log(f"warning: skipping damaged checkpoint {err}")
    return None, None


def prune_checkpoints(checkpoint_dir: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Keep the newest `keep` *verified* checkpoints (checksums) and delete the ones older than them,
    and stale temp folders of dead writers. `protect` is the checkpoint just written (its digests were
    computed from the bytes in memory): it counts as verified without reading it back.

    A damaged checkpoint never counts towards `keep`, so it can never push out the last good one. One
    newer than the kept ones is left as it is (resume skips it with a warning; the run replaces it when
    it saves that step again). Only folders with a readable manifest (our own marker) are ever deleted:
    a step_* folder without one was not written by this tool's atomic save. No other writer can be
    saving here meanwhile: the run holds the folder's lock (runlock.py).
    """
    removed = []
    verified = 0
    for path in list_checkpoints(checkpoint_dir):
        if verified < keep:
            try:
                verify_checkpoint(path, checksums=path != protect)
                verified += 1
            except CheckpointError:
                pass  # damaged: not counted, and not deleted while it is among the newest
            continue
        if path == protect:
            continue
        try:
            read_manifest(path)
        except CheckpointError:
            continue  # no manifest of ours: not provably this tool's checkpoint, never deleted
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    remove_dead_writers_temp(checkpoint_dir, ".step_*.tmp-*")
    return removed
