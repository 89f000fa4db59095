"""`.prepare_state.json`: what each WAV in a prepared data_dir was made from.

prepare_convert.py writes it, so a re-run with the same source and settings reuses a WAV instead of
converting it again; prepare_checks.py reads which WAVs this tool wrote (only those may be replaced or
deleted by --clean).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..jsonfile import write_json_atomic
from .corpus_rows import Source

STATE_NAME = ".prepare_state.json"


def load_state(data_dir: Path) -> dict:
    try:
        state = json.loads((data_dir / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no state (first run) or a damaged one: everything is simply converted again
    return state if isinstance(state, dict) and isinstance(state.get("clips"), dict) else {}


def save_state(data_dir: Path, source: Source, clips: dict[str, dict]) -> None:
    write_json_atomic(
        data_dir / STATE_NAME, {"version": 1, "source": source.location, "clips": clips}, indent=None
    )
