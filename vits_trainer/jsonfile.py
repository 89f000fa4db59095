"""Files written atomically: a temp file beside the target, fsync'ed, then renamed over it, so a reader
(or the next run after a crash) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def strict_json(data, **kwargs) -> str:
    """`json.dumps` with NaN/Infinity written as null: Python writes them as bare words, which strict
    readers refuse (jq, a browser's JSON.parse, most languages' parsers). For every record a user may
    read (metrics.jsonl, train_summary.json, the feedback reports), where a diverged evaluation is NaN."""
    return json.dumps(_finite_or_null(data), allow_nan=False, **kwargs)


def _finite_or_null(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def write_json_atomic(path: Path, data: dict, indent: int | None = 1) -> None:
    """NaN/Infinity as null (see `strict_json`): a feedback round's per-clip scores may be NaN."""
    write_text_atomic(path, strict_json(data, indent=indent, ensure_ascii=False, default=str))


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # the callers' own fixed-name outputs (see safety.py's inventory)
