"""Checkpoint folders by name: `step_NNNNNNNN` under a run's checkpoint dir, and the listing of them.

Without torch, so that the command line's checks before torch loads (config.py) and the checkpoint
module see the same checkpoints: a temp folder (`.step_N.tmp-PID`) or a `step_*` name of something
else (`step_notes/`, a file) is none.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^step_(\d{8,})$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def step_of(name: str) -> int | None:
    """The step a `step_NNNNNNNN` folder (a checkpoint, or its samples) is named for; None for other names."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def list_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Checkpoint folders, newest (highest step) first, complete or not (a manifest says that).
    Temp folders are never listed."""
    if not checkpoint_dir.is_dir():
        return []
    found = [
        (step_of(p.name), p) for p in checkpoint_dir.iterdir() if p.is_dir() and step_of(p.name) is not None
    ]
    return [p for _, p in sorted(found, reverse=True)]
