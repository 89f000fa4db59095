"""A feedback run's version folders (v1, v2, ...) under --output_dir, which one a run continues or starts,
and the `latest` pointer (latest.json and a `latest` symlink) to the last promoted version.

Apart from round.py because these are the folder conventions, read without a run (tests, tools).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from ..errors import UserError
from ..jsonfile import write_json_atomic

REPORT_NAME = "feedback_report.json"
RUN_NAME = "feedback_run.json"
LATEST_JSON = "latest.json"
LATEST_LINK = "latest"
VERSION_MARKER = ".feedback_version"  # in every vN/ this tool makes, from the moment it exists
_VERSION = re.compile(r"^v(\d+)$")


def list_versions(root: Path) -> list[tuple[int, Path]]:
    """(number, folder) of every version under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION.match(p.name))]
    return sorted(found)


def is_finished(version: Path) -> bool:
    return (version / REPORT_NAME).is_file()


def has_resumable_checkpoint(version: Path) -> bool:
    from ..training.checkpoint import find_resumable

    return find_resumable(version / "checkpoints", log=lambda _: None)[0] is not None


def choose_version(root: Path, resume: str) -> tuple[Path, bool]:
    """(version folder, whether it continues an interrupted run) for `--resume`.

    auto: the newest version when it has no report yet (resumed from its checkpoint, or started again
    when it never saved one); else a new number. Only the newest: an older unfinished run would start
    from a base that a newer version has since replaced. none: always a new number.
    """
    versions = list_versions(root)
    next_version = root / f"v{(versions[-1][0] if versions else 0) + 1}"
    if resume == "none":
        return next_version, False
    if resume == "auto":
        if versions and not is_finished(versions[-1][1]):
            newest = versions[-1][1]
            return newest, has_resumable_checkpoint(newest)
        return next_version, False
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise UserError(f"--resume {resume}: no such checkpoint folder")
    version = path.resolve().parent.parent
    if path.resolve().parent.name != "checkpoints" or version.parent != root.resolve():
        raise UserError(
            f"--resume {resume}: not a checkpoint of a version in {root} (<version>/checkpoints/step_*)"
        )
    if is_finished(version):
        raise UserError(
            f"--resume {resume}: {version.name} is finished (it has {REPORT_NAME}); start a new version"
        )
    return version, True


def claim_version(version: Path) -> bool:
    """Make `version` (with its marker, in one rename: another rank sees it whole or not at all); True
    when this process made it. One that exists must be this tool's: a `vN/` of the user's under
    --output_dir is refused, never written into (its checkpoints/ and samples/ were cleared)."""
    if not version.exists():
        tmp = version.with_name(f".{version.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / VERSION_MARKER).write_text(f"made by train_feedback.py, pid {os.getpid()}\n", encoding="utf-8")
        try:
            os.rename(tmp, version)
            return True
        except OSError:  # another rank made it meanwhile
            for leftover in tmp.iterdir():
                leftover.unlink()
            tmp.rmdir()
    if not any((version / name).is_file() for name in (VERSION_MARKER, RUN_NAME, REPORT_NAME)):
        raise UserError(
            f"--output_dir {version.parent}: {version.name}/ was not made by train_feedback.py (no "
            f"{VERSION_MARKER}); move it away, or choose another --output_dir"
        )
    return False


def read_latest(root: Path) -> dict | None:
    try:
        return json.loads((root / LATEST_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_latest(root: Path, version: Path, log) -> dict:
    """Make `version` the current model: latest.json (atomic) and a `latest` symlink where possible."""
    pointer = {
        "version": version.name,
        "path": str((version / "model").resolve()),
        "relative_path": f"{version.name}/model",
        "report": f"{version.name}/{REPORT_NAME}",
        "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(root / LATEST_JSON, pointer)  # refused up front unless ours (check_feedback_paths)
    link = root / LATEST_LINK
    if link.exists() and not link.is_symlink():
        log(f"warning: {link} is not a symlink; left as it is ({LATEST_JSON} names the current model)")
        return pointer
    tmp = root / f".{LATEST_LINK}.tmp-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)  # our pid's temp link
        os.symlink(pointer["relative_path"], tmp, target_is_directory=True)
        os.replace(tmp, link)  # `link` is missing or a symlink (a real folder was left alone above)
    except OSError:  # a filesystem without symlinks: latest.json alone says it
        tmp.unlink(missing_ok=True)
    return pointer
