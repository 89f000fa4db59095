"""Files written atomically: a temp file beside the target, fsync'ed, then renamed over it, so a reader
(or the next run after a crash) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: Path, data: dict, indent: int | None = 1) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str))


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # the callers' own fixed-name outputs (see safety.py's inventory)
