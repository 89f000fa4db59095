"""What a multi-process launch (torchrun, accelerate launch) tells this process through its environment.

Read in one place, so the thread count (training/runtime.py) and the RAM share of the preloaded clips
(data/clipstore.py) never disagree about a value, and a stray one is said once instead of crashing.
"""

from __future__ import annotations

import os


def _local_world_size() -> tuple[int, str | None]:
    """LOCAL_WORLD_SIZE as a count, and the raw value when it is set but no positive whole number."""
    raw = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not raw.strip():
        return 1, None
    try:
        count = int(raw)
    except ValueError:
        return 1, raw
    return (count, None) if count >= 1 else (1, raw)


def local_processes() -> int:
    """The processes of this launch on this machine (LOCAL_WORLD_SIZE); 1 when unset or not a count:
    a stray value must not stop a run (a launcher always sets a positive number)."""
    return _local_world_size()[0]


def local_processes_warning() -> str | None:
    """The line that says a stray LOCAL_WORLD_SIZE is read as one process, or None."""
    raw = _local_world_size()[1]
    if raw is None:
        return None
    return (
        f"warning: LOCAL_WORLD_SIZE={raw!r} is not a number of processes: counted as 1 process "
        "(threads and the RAM for the clips are not split)"
    )
