#!/usr/bin/env python
"""Turn a speech corpus into a VITS training set: wavs/<id>.wav (mono 16-bit) + metadata.csv (id|text|speaker).

Examples:
  python prepare_data.py --source LJSpeech-1.1 --data_dir training --model_name facebook/mms-tts-eng
  python prepare_data.py --source cv-corpus/en --split train --speaker 1a2b3c --sample_rate 16000
  python prepare_data.py --source clips.tsv --audio_column file --text_column transcript
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vits_trainer.data.corpus import FORMATS
from vits_trainer.data.prepare import prepare
from vits_trainer.data.prepare_settings import PrepareSettings, default_workers
from vits_trainer.errors import ArgumentParser, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Writes <data_dir>/prepare_report.json (every skipped row and why) and re-uses WAVs "
        "converted by an earlier run when their source is unchanged.",
    )
    src = parser.add_argument_group("source")
    src.add_argument(
        "--source",
        required=True,
        help="corpus folder, CSV/TSV file, datasets folder, or Hugging Face hub dataset id",
    )
    src.add_argument(
        "--format",
        default="auto",
        choices=FORMATS,
        help="source layout: ljspeech (metadata.csv + wavs/), commonvoice (validated.tsv + clips/), "
        "csv (table with audio-path and text columns), hf (datasets dataset), "
        "audiofolder (metadata with file_name), pairs (x.wav + x.txt); auto detects",
    )
    src.add_argument(
        "--split",
        default=None,
        help="which part of the source to read: a datasets split (default: train), an audiofolder's "
        "subfolder, or the Common Voice TSV (e.g. train, dev, test; default: validated, else train)",
    )
    src.add_argument(
        "--audio_column",
        default=None,
        help="audio column (default: the first of audio, path, file_name, ... that exists)",
    )
    src.add_argument(
        "--text_column",
        default=None,
        help="text column (default: the first of sentence, text, transcription, normalized_text)",
    )
    src.add_argument(
        "--speaker_column",
        default=None,
        help="speaker column (default: a column named speaker, else none: every clip is speaker 0)",
    )
    src.add_argument(
        "--id_column",
        default=None,
        help="id column (default: the audio path as the table gives it, without its extension, "
        "folders joined by _: wavs/a.wav -> wavs_a)",
    )

    out = parser.add_argument_group("output")
    out.add_argument("--data_dir", default="training", help="output folder (wavs/ + metadata.csv)")
    out.add_argument(
        "--sample_rate",
        type=int,
        default=None,
        help="target rate in Hz (default: the --model_name config's sampling_rate, else 16000)",
    )
    out.add_argument(
        "--model_name",
        default=None,
        help="model folder or hub id: its sampling_rate is the target and its vocabulary is checked "
        "(default: none; then no vocabulary check)",
    )
    out.add_argument(
        "--clean", action="store_true", help="delete WAVs in data_dir/wavs not listed in metadata.csv"
    )
    out.add_argument(
        "--num_workers", type=int, default=default_workers(), help="conversion processes (<= 1: in-process)"
    )

    checks = parser.add_argument_group("checks and filters")
    checks.add_argument("--min_seconds", type=float, default=0.5, help="skip shorter clips")
    checks.add_argument("--max_seconds", type=float, default=20.0, help="skip longer clips")
    checks.add_argument("--trim_silence", action="store_true", help="trim leading/trailing silence first")
    checks.add_argument(
        "--trim_top_db", type=float, default=40.0, help="--trim_silence threshold below peak, dB"
    )
    checks.add_argument("--lowercase", action="store_true", help="lower-case the text")
    checks.add_argument(
        "--drop_unknown_chars",
        action="store_true",
        help="skip rows with characters the model's vocabulary lacks (else: kept, and counted per character)",
    )
    checks.add_argument(
        "--speaker", nargs="+", default=None, help="keep only these speaker ids (default: all)"
    )
    checks.add_argument("--max_samples", type=int, default=0, help="keep at most this many rows (0 = all)")
    checks.add_argument(
        "--no_progress", action="store_true", help="no progress bar, nor progress lines off a terminal"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = PrepareSettings(
        source=args.source,
        data_dir=Path(args.data_dir),
        format=args.format,
        split=args.split,
        audio_column=args.audio_column,
        text_column=args.text_column,
        speaker_column=args.speaker_column,
        id_column=args.id_column,
        sample_rate=args.sample_rate,
        model_name=args.model_name,
        min_seconds=args.min_seconds,
        max_seconds=args.max_seconds,
        trim_silence=args.trim_silence,
        trim_top_db=args.trim_top_db,
        lowercase=args.lowercase,
        drop_unknown_chars=args.drop_unknown_chars,
        speakers=args.speaker,
        max_samples=args.max_samples,
        num_workers=args.num_workers,
        clean=args.clean,
        progress=not args.no_progress,
    )
    prepare(settings)
    return 0


if __name__ == "__main__":
    # SIGTERM stops as Ctrl-C does: the WAVs converted so far are recorded; never one of a launch's processes
    sys.exit(run_command(main, one_process=True))
