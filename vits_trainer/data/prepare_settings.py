"""prepare_data.py's settings: one dataclass, one field per flag (validated by prepare_checks.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PrepareSettings:
    source: str
    data_dir: Path = Path("training")
    format: str = "auto"
    split: str | None = None
    audio_column: str | None = None
    text_column: str | None = None
    speaker_column: str | None = None
    id_column: str | None = None
    sample_rate: int | None = None
    model_name: str | None = None
    min_seconds: float = 0.5
    max_seconds: float = 20.0
    trim_silence: bool = False
    trim_top_db: float = 40.0
    lowercase: bool = False
    drop_unknown_chars: bool = False
    speakers: list[str] | None = None
    max_samples: int = 0
    num_workers: int = field(default_factory=lambda: default_workers())
    clean: bool = False
    progress: bool = True


def default_workers() -> int:
    return os.cpu_count() or 1
