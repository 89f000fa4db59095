"""Helpers shared by the test_prepare_* modules: generated audio and a quiet in-process prepare run.

No tests here; the other modules import these functions (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from vits_trainer.data.metadata import read_metadata
from vits_trainer.data.prepare import PrepareResult, prepare
from vits_trainer.data.prepare_settings import PrepareSettings
from vits_trainer.data.synthetic import synth_text


def speech(text: str = "abc def gh", rate: int = 22050, speaker: int = 0, seconds: float = 0.8) -> np.ndarray:
    """Tone-language audio for `text`, padded with silence to at least `seconds` (above the 0.5 s minimum)."""
    audio = synth_text(text, rate, speaker)
    return np.pad(audio, (0, max(0, int(seconds * rate) - len(audio))))


def write_audio(path: Path, audio: np.ndarray, rate: int = 22050, subtype: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, audio, rate, subtype=subtype)
    return path


def run_prepare(source, data_dir, **overrides) -> tuple[PrepareResult, list[str]]:
    """prepare() in-process, no progress bar, one worker unless asked; returns (result, printed lines)."""
    lines: list[str] = []
    settings = PrepareSettings(source=str(source), data_dir=Path(data_dir), num_workers=1, progress=False)
    for key, value in overrides.items():
        setattr(settings, key, value)
    result = prepare(settings, log=lines.append)
    return result, lines


def vocab_model_dir(tmp_path: Path, rate: int = 22050) -> Path:
    """A model folder with only a tokenizer and config.json: enough for prepare's rate and vocabulary."""
    from vits_trainer.model.tiny import make_tokenizer

    model = tmp_path / "model"
    make_tokenizer(model)  # tone-language alphabet a..o + space, lower-casing like MMS
    (model / "config.json").write_text(
        json.dumps({"model_type": "vits", "sampling_rate": rate}), encoding="utf-8"
    )
    return model


def skipped_reasons(data_dir: Path) -> dict[str, str]:
    """id (or origin, for rows without an id) -> reason, from prepare_report.json."""
    report = json.loads((Path(data_dir) / "prepare_report.json").read_text(encoding="utf-8"))
    return {s["id"] or s["origin"]: s["reason"] for s in report["skipped_rows"]}


def output_rows(data_dir: Path) -> dict[str, tuple[str, str]]:
    rows, problems = read_metadata(Path(data_dir) / "metadata.csv")
    assert problems == []
    return {r.id: (r.text, r.speaker) for r in rows}


def wav_info(path: Path) -> tuple[int, int, str]:
    info = sf.info(path)
    return info.samplerate, info.channels, info.subtype
