"""Listen to a model folder: speak sentences to 16-bit WAV files and report the real-time factor.

Examples:
  python speak.py --model training/final_model --text "silav, tu çawa yî?" --out hello.wav
  python -m vits_trainer.speak --model training/checkpoints/best_model --text_file lines.txt --out listen
  python speak.py --model training/checkpoints/step_00003000 --text_file lines.txt --out step3000
"""

# A command, like the scripts beside the package: it sits above every layer (tests/test_layout.py) and
# nothing imports it but ../speak.py, which runs it from any folder. Flags, paths and the model's
# speakers are checked before torch is imported, so a mistake costs a fraction of a second; the
# speaking itself is model/synthesis.py.

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .data.metadata import decode_text, read_file_bytes
from .errors import ArgumentParser, UserError, run_command
from .hub import read_model_config, resolve_model_dir
from .model.speakers import is_bare_id

SPEAKERS_FILE = "speakers.json"  # speaker name -> id, written beside exported multi-speaker models


# --speaking_rate's range: far slower stretched each token's frames past what memory holds (1e-30
# overflowed the frame count: a traceback); far faster speaks every character in a single frame
SPEAKING_RATES = (0.1, 10.0)


def _speaking_rate(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    low, high = SPEAKING_RATES
    if not low <= number <= high:
        raise argparse.ArgumentTypeError(
            f"must be between {low:g} and {high:g} (1 = the model's own pace), got {value}"
        )
    return number


def _seed(value: str) -> int:
    """A seed torch takes (a negative one too): one outside its range was a traceback once the model
    had loaded."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if not -(2**63) <= number < 2**64:
        raise argparse.ArgumentTypeError(f"must be from -2**63 to 2**64 - 1, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python speak.py",
        description=__doc__.split("\n\n")[0],
        epilog="Prints one line per file (seconds of audio, seconds taken, RTF = synthesis time / audio "
        "duration) and a total. Existing WAVs are never replaced without --overwrite.",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="model folder (final_model, best_model, a feedback version, any transformers VITS folder), "
        "a training checkpoint (<checkpoint_dir>/step_NNNNNNNN: hear the run at that step) or a hub id "
        "already in the local cache",
    )
    text = parser.add_mutually_exclusive_group(required=True)
    text.add_argument(
        "--text",
        help="the text to speak, into one file (--out is then a .wav file); a text over 400 characters is "
        "spoken in pieces, sentence by sentence",
    )
    text.add_argument(
        "--text_file",
        help="UTF-8 file (or UTF-16 with its byte-order mark), one sentence per line (blank lines skipped); "
        "--out is then a folder that gets 0001.wav, 0002.wav, ...",
    )
    parser.add_argument("--out", required=True, help="output .wav file (--text) or folder (--text_file)")
    voice = parser.add_mutually_exclusive_group()
    voice.add_argument(
        "--speaker_id", type=int, default=None, help="speaker of a multi-speaker model (default: 0)"
    )
    voice.add_argument("--speaker", default=None, help="speaker name, looked up in the model's speakers.json")
    parser.add_argument(
        "--speaking_rate",
        type=_speaking_rate,
        default=None,
        help="speed factor: above 1 faster, below 1 slower (default: the model config's speaking_rate)",
    )
    parser.add_argument(
        "--seed", type=_seed, default=0, help="seed of the model's noise: same seed, same take"
    )
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda when available"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace output WAVs that already exist")
    return parser


@dataclass
class Sentence:
    text: str
    where: str  # how an error names it: `--text` or `--text_file F line N`
    path: Path  # the WAV it becomes


def read_sentences(args: argparse.Namespace) -> list[Sentence]:
    """The sentences and their output paths; the output is checked, nothing is written yet."""
    out = Path(args.out).expanduser()
    if args.text is not None:
        if not args.text.strip():
            raise UserError("--text is empty: nothing to speak")
        if out.is_dir():
            raise UserError(f"--out {args.out} is a folder; with --text give a .wav file name")
        if out.suffix.lower() != ".wav":
            raise UserError(f"--out {args.out}: with --text give a .wav file name")
        return [Sentence(args.text.strip(), "--text", out)]
    source = Path(args.text_file).expanduser()
    if not source.exists():
        raise UserError(f"--text_file {args.text_file}: no such file")
    name = f"--text_file {args.text_file}"
    lines = decode_text(read_file_bytes(source, name), name).splitlines()  # a folder too: one error line
    numbered = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise UserError(f"--text_file {args.text_file}: no sentences (every line is blank)")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {args.out} is a file; with --text_file give a folder")
    width = max(4, len(str(len(numbered))))
    return [
        Sentence(text, f"--text_file {args.text_file} line {n}", out / f"{k:0{width}d}.wav")
        for k, (n, text) in enumerate(numbered, 1)
    ]


def check_not_overwriting(sentences: list[Sentence], overwrite: bool) -> None:
    if overwrite:
        return
    existing = [s.path for s in sentences if s.path.exists()]
    if existing:
        shown = ", ".join(str(p) for p in existing[:3]) + (
            f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        )
        raise UserError(
            f"{shown} already exist{'s' if len(existing) == 1 else ''}; pass --overwrite to replace"
        )


def check_writable(sentences: list[Sentence], out: str) -> None:
    """Before the model loads: every WAV's folder, or its nearest existing parent, can be written."""
    for folder in sorted({s.path.parent for s in sentences}):
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"--out {out}: {existing} cannot be written (read-only, or no permission)")


def speaker_names(model_dir: Path, trainer_state: dict | None) -> tuple[dict | None, str]:
    """(speaker name -> id, where the names come from): an export's speakers.json, or a checkpoint's
    trainer state. None when the model has no names."""
    if trainer_state is not None:
        return trainer_state.get("speakers"), f"{model_dir}'s trainer_state.json"
    path = model_dir / SPEAKERS_FILE
    if not path.is_file():
        return None, str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8")), str(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a JSON file ({err})") from None


def choose_speaker(
    args: argparse.Namespace, model_dir: Path, trainer_state: dict | None = None
) -> tuple[int, str]:
    """(speaker id, how the report names it), checked against the model's config and its speaker names
    (the folder passed check_model_folder, or is a verified checkpoint: its config.json is VITS's)."""
    config = read_model_config(model_dir, "--model")
    count = int(config.get("num_speakers") or 1)
    if args.speaker is not None:
        names, where = speaker_names(model_dir, trainer_state)
        if names is None:
            hint = "a single-speaker model" if count <= 1 else f"use --speaker_id 0..{count - 1}"
            raise UserError(f"--speaker {args.speaker}: {args.model} has no speaker names ({hint})")
        if not isinstance(names, dict) or args.speaker not in names:
            known = ", ".join(sorted(map(str, names))[:10]) if isinstance(names, dict) else ""
            raise UserError(f"--speaker {args.speaker}: not in {where} (it has: {known or 'no names'})")
        # "1 = bob", as an id given alone is named below: one voice reads the same either way
        speaker_id, label = names[args.speaker], f"{names[args.speaker]} = {args.speaker}"
        if isinstance(speaker_id, bool) or not isinstance(speaker_id, int):
            raise UserError(f"{where}: speaker {args.speaker!r} maps to {speaker_id!r}, not an id")
    else:
        speaker_id = 0 if args.speaker_id is None else args.speaker_id
        label = str(speaker_id)
    if count <= 1 and speaker_id != 0:
        raise UserError(f"speaker {label}: {args.model} is a single-speaker model (only speaker 0)")
    if not 0 <= speaker_id < count:
        raise UserError(f"speaker {label}: {args.model} has speakers 0..{count - 1}")
    if args.speaker is None and count > 1:  # an id alone says nothing of whose voice it is
        label += _name_of(speaker_id, model_dir, trainer_state)
    return speaker_id, label


def _name_of(speaker_id: int, model_dir: Path, trainer_state: dict | None) -> str:
    """` = NAME` when the model's speaker names give `speaker_id` one; nothing otherwise (an id works
    without names, so an unreadable speakers.json is left to --speaker to report)."""
    try:
        names, _ = speaker_names(model_dir, trainer_state)
    except UserError:
        return ""
    if not isinstance(names, dict):
        return ""
    found = sorted(
        str(name) for name, sid in names.items() if sid == speaker_id and not is_bare_id(name, sid)
    )
    return f" = {', '.join(found)}" if found else ""


def open_checkpoint(model_dir: Path, flag: str):
    """A training checkpoint (`step_*`), every file checked against its manifest: a damaged one is one
    error line, before the model loads."""
    from .training.checkpoint import CheckpointError, verify_checkpoint
    from .training.trainstate import LoadedCheckpoint

    try:
        return LoadedCheckpoint(model_dir, verify_checkpoint(model_dir, checksums=True))
    except (CheckpointError, OSError) as err:
        raise UserError(
            f"{flag} {model_dir}: damaged checkpoint ({err}); use an earlier step_* folder"
        ) from None


def _line(name: str, audio: float, taken: float) -> str:
    rtf = taken / audio if audio > 0 else float("inf")
    return f"{name}  {audio:5.2f} s audio  {taken:5.2f} s taken  RTF {rtf:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sentences = read_sentences(args)
    check_not_overwriting(sentences, args.overwrite)
    model_dir = resolve_model_dir(args.model, "--model")
    from .training.modelfolder import check_model_folder, is_training_checkpoint

    checkpoint = None
    if is_training_checkpoint(model_dir):  # a step_* folder of a run: heard as it is, nothing exported
        checkpoint = open_checkpoint(model_dir, "--model")
    else:  # config.json unreadable or not VITS, no vocab.json, damaged weights
        check_model_folder(model_dir, "--model")
    trainer_state = checkpoint.json("trainer_state.json") if checkpoint is not None else None
    speaker_id, speaker = choose_speaker(args, model_dir, trainer_state)
    check_writable(sentences, args.out)

    import numpy as np

    from .data.audio import write_wav
    from .model import synthesis  # torch and transformers: only once the command line is known good

    start = time.perf_counter()
    device = synthesis.choose_device(args.device)
    if checkpoint is None:
        voice = synthesis.load_voice(model_dir, device)
    else:
        from .model.vits import plain_copy
        from .training.networks import model_from_checkpoint

        model, text = model_from_checkpoint(checkpoint)
        voice = synthesis.Voice(plain_copy(model).to(device), text, device)  # weight norm folded: faster
    ids = [synthesis.encode_sentence(voice, s.text, s.where) for s in sentences]
    for folder in {s.path.parent for s in sentences}:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"--out {args.out}: cannot create {folder} ({err.strerror})") from None
    print(
        f"{args.model}: {voice.sampling_rate} Hz, speaker {speaker}, {device.type}, "
        f"loaded in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    total_audio = total_taken = 0.0
    files = f"{len(sentences)} file{'s' if len(sentences) != 1 else ''}"
    width = max(len(f"total ({files})"), *(len(str(s.path)) for s in sentences))
    for sentence, token_ids in zip(sentences, ids, strict=True):  # token ids of the sentence's pieces
        dropped = synthesis.unknown_characters(voice, sentence.text)
        if dropped:  # each character apart: run together they read like a word
            shown = " ".join(repr(c) for c in dropped)
            print(
                f"note: {sentence.where} ({sentence.path.name}): not in the vocabulary, not spoken: {shown}",
                flush=True,
            )
        if len(token_ids) > 1:
            print(
                f"note: {sentence.where} ({sentence.path.name}): {len(sentence.text)} characters, spoken "
                f"in {len(token_ids)} pieces of at most {synthesis.PIECE_CHARS}, sentence by sentence",
                flush=True,
            )
        take = synthesis.speak(voice, token_ids, speaker_id, args.seed, args.speaking_rate)
        bad = int(take.waveform.size - np.count_nonzero(np.isfinite(take.waveform)))
        if bad:  # written as 16-bit they were noise or silence, and nothing said why
            raise UserError(
                f"{args.model}: its output for {sentence.where} holds {bad} NaN/Inf samples of "
                f"{take.waveform.size}: its weights are broken (a training run that diverged), so "
                f"{sentence.path} is not written; speak an earlier checkpoint or the run's best_model"
            )
        try:
            write_wav(sentence.path, take.waveform, take.sampling_rate)  # a new file, or --overwrite
        except OSError as err:
            raise UserError(f"--out {sentence.path}: cannot write it ({err.strerror or err})") from None
        total_audio += take.seconds_of_audio
        total_taken += take.seconds_taken
        print(_line(str(sentence.path).ljust(width), take.seconds_of_audio, take.seconds_taken), flush=True)
    print(_line(f"total ({files})".ljust(width), total_audio, total_taken), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, one_process=True))
