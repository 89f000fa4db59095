"""What a multi-process launch (torchrun, accelerate launch) tells this process through its environment:
RANK, WORLD_SIZE and LOCAL_WORLD_SIZE.

Read in one place, so that every part agrees about a value (the thread count in training/runtime.py and
the RAM share of the preloaded clips in data/clipstore.py about LOCAL_WORLD_SIZE), and a value no
launcher sets (left over in a notebook or a shell profile, even empty) is said once instead of stopping
the run with a traceback, the error handler's included.
"""

from __future__ import annotations

import os

# each variable: the value it means when unset or stray, the smallest a launcher sets, and what it counts
_VARIABLES: dict[str, tuple[int, int, str | None]] = {
    "RANK": (0, 0, "is not a process number: this process counts as the main one (0)"),
    # accelerate reads it as a number itself (a CPU run's set-up): training/runtime.py refuses it
    "WORLD_SIZE": (1, 1, None),
    "LOCAL_WORLD_SIZE": (
        1,
        1,
        "is not a number of processes: counted as 1 process (threads and the RAM for the clips are not split)",
    ),
}


def _read(name: str) -> tuple[int, str | None]:
    """The variable as a number, and its raw value when it is set but not a whole number a launcher sets
    (a RANK is one of the launch's WORLD_SIZE processes: RANK=1 alone is a leftover, not a second process)."""
    default, smallest, _ = _VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None:
        return default, None
    try:
        value = int(raw)
    except ValueError:
        return default, raw
    if value < smallest or (name == "RANK" and value >= world_size()):
        return default, raw
    return value, None


def process_rank() -> int:
    """This process's number in its launch (RANK); 0, the main process, when unset or stray."""
    return _read("RANK")[0]


def world_size() -> int:
    """The processes of this launch (WORLD_SIZE); 1 when unset or stray."""
    return _read("WORLD_SIZE")[0]


def local_processes() -> int:
    """The processes of this launch on this machine (LOCAL_WORLD_SIZE); 1 when unset or stray."""
    return _read("LOCAL_WORLD_SIZE")[0]


def stray_world_size() -> str | None:
    """WORLD_SIZE as it is set when no launcher would set it so (accelerate reads it as a number), else
    None."""
    return _read("WORLD_SIZE")[1]


def launch_warnings() -> list[str]:
    """A line for each of the variables set to something no launcher sets, saying how it is read; from
    the main process only (every process of a launch reads the same environment: once is enough)."""
    lines = []
    if process_rank() != 0:
        return lines
    for name, (_, _, meaning) in _VARIABLES.items():
        raw = _read(name)[1]
        if raw is not None and meaning is not None:
            lines.append(f"warning: {name}={raw!r} {meaning}")
    return lines
