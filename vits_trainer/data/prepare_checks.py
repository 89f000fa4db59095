"""prepare_data.py's checks: settings, the output folder (no source file is an output), the target
model, and every row before audio.

A row is checked in this order: parse (source reader) -> id -> text -> speaker filter -> --max_samples
(that many rows already planned) -> vocabulary; `plan_rows` returns the survivors and every skip with its
reason. The audio checks
(missing, unreadable, empty, NaN/Inf, silent, duration) need the decoded clip: prepare_convert.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..hub import read_model_config, resolve_model_dir
from ..safety import DATA_PARTS, inside, refuse, resolved
from .corpus_rows import Candidate, Problem, Source
from .metadata import WAVS_DIR
from .prepare_state import STATE_NAME, owned_ids

if TYPE_CHECKING:
    from .prepare_settings import PrepareSettings

DEFAULT_SAMPLE_RATE = 16000
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")  # what str.splitlines() splits on
MAX_ID_LENGTH = 120
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 192000  # telephone speech to studio masters


@dataclass
class Planned:
    clip_id: str
    row: Candidate
    text: str
    speaker: str


@dataclass
class Skip:
    id: str
    origin: str
    reason: str
    detail: str = ""


class Vocabulary:
    """The characters a VitsTokenizer keeps; MMS tokenizers lower-case (when `normalize`) and drop the rest."""

    def __init__(self, symbols: set[str], lowercase: bool) -> None:
        self.symbols = symbols
        self.lowercase = lowercase

    def unknown(self, text: str) -> list[str]:
        out = []
        for ch in text:
            if ch in self.symbols:
                continue
            # The tokenizer keeps a character that is in the vocabulary as is, lower-cases the others.
            if self.lowercase and ch.lower() in self.symbols:
                continue
            out.append(ch.lower() if self.lowercase else ch)
        return out


# --- settings and inputs -----------------------------------------------------------------------------


def validate_settings(s: PrepareSettings) -> None:
    if s.sample_rate is not None and not MIN_SAMPLE_RATE <= s.sample_rate <= MAX_SAMPLE_RATE:
        raise UserError(
            f"--sample_rate must be between {MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE} Hz (TTS models use "
            f"16000-48000), got {s.sample_rate}"
        )
    for flag, value in (("--min_seconds", s.min_seconds), ("--max_seconds", s.max_seconds)):
        if not math.isfinite(value):
            raise UserError(f"{flag} must be a number of seconds, got {value}")
    if s.min_seconds < 0:
        raise UserError(f"--min_seconds must be >= 0, got {s.min_seconds}")
    if s.max_seconds <= 0:
        raise UserError(f"--max_seconds must be > 0, got {s.max_seconds}")
    if s.min_seconds > s.max_seconds:
        raise UserError(f"--min_seconds {s.min_seconds} is greater than --max_seconds {s.max_seconds}")
    if s.max_samples < 0:
        raise UserError(f"--max_samples must be >= 0 (0 = all), got {s.max_samples}")
    if not s.trim_top_db > 0:  # NaN trimmed every clip to nothing: "no usable clips (too_short N)"
        raise UserError(f"--trim_top_db must be > 0, got {s.trim_top_db}")
    if s.num_workers < 0:
        raise UserError(f"--num_workers must be >= 0, got {s.num_workers}")


def check_output_folder(data_dir: Path) -> None:
    """Fail early (before anything is written) when the output `data_dir` cannot be created or written."""
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(
            f"--data_dir {data_dir}: exists and is a file, not a folder: choose another --data_dir "
            "(a folder, new or from an earlier run, where the prepared clips go)"
        )
    wavs = data_dir / WAVS_DIR
    if wavs.exists() and not wavs.is_dir():
        raise UserError(
            f"--data_dir {data_dir}: {wavs} exists and is a file, not a folder: move it away or choose "
            "another --data_dir"
        )
    existing = data_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(
            f"--data_dir {data_dir}: cannot be created ({existing} is a file): choose another --data_dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--data_dir {data_dir}: {existing} is not writable")


def resolve_target(settings: PrepareSettings) -> tuple[int, Vocabulary | None, list[str]]:
    """Target sample rate (flag, else the model's, else 16 kHz) and the model's vocabulary, if any."""
    if settings.model_name is None:
        return settings.sample_rate or DEFAULT_SAMPLE_RATE, None, []
    model_dir = resolve_model_dir(settings.model_name)
    model_rate = int(read_model_config(model_dir, "--model_name").get("sampling_rate") or DEFAULT_SAMPLE_RATE)
    if settings.sample_rate is not None and settings.sample_rate != model_rate:
        raise UserError(
            f"--sample_rate {settings.sample_rate} disagrees with --model_name {settings.model_name} "
            f"(sampling_rate {model_rate}); drop --sample_rate so the data matches the model"
        )
    vocab, notes = load_vocabulary(model_dir)
    return model_rate, vocab, notes


def load_vocabulary(model_dir: Path) -> tuple[Vocabulary | None, list[str]]:
    vocab_file = model_dir / "vocab.json"
    if not vocab_file.is_file():
        return None, [f"{model_dir} has no vocab.json: character check skipped"]
    config_file = model_dir / "tokenizer_config.json"
    try:
        vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        # a list's items would pass for the characters, a number fails in set(): neither is a tokenizer's
        for name, value in ((vocab_file.name, vocab), (config_file.name, config)):
            if not isinstance(value, dict):
                raise ValueError(f"{name} holds a JSON {type(value).__name__}, not a JSON object")
    except (OSError, ValueError) as err:
        raise UserError(f"{vocab_file}: unreadable tokenizer files ({err})") from None
    symbols = set(vocab)
    if config.get("is_uroman") or config.get("phonemize"):
        how = "romanises (uroman)" if config.get("is_uroman") else "phonemizes"
        return None, [f"the model's tokenizer {how} text first: character check skipped"]
    return Vocabulary(symbols, bool(config.get("normalize", True))), []


# --- row checks --------------------------------------------------------------------------------------


def safe_id(source_id: str, tagged: bool = False) -> str:
    """A filesystem-safe id: [A-Za-z0-9_.-] only, no leading dot, at most MAX_ID_LENGTH characters.
    `tagged`: ending in a digest of `source_id`, for ids that collide or vanish once made safe."""
    clip_id = re.sub(r"[^A-Za-z0-9_.-]", "_", source_id.strip())
    if clip_id.startswith("."):
        clip_id = "_" + clip_id[1:]
    if tagged or len(clip_id) > MAX_ID_LENGTH:
        # Keep it unique: two long ids sharing a prefix must not collide after shortening.
        digest = hashlib.blake2b(source_id.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
        clip_id = f"{clip_id[: MAX_ID_LENGTH - 9]}_{digest}"
    return clip_id


def clean_text(raw: str, lowercase: bool = False) -> tuple[str, str | None, str]:
    """Return (text, reason, detail): NFC, whitespace collapsed; reason is None when the text is usable."""
    text = unicodedata.normalize("NFC", raw).strip()
    if "|" in text:
        return "", "text_has_pipe", "'|' separates metadata.csv fields"
    if any(ch in LINE_BREAKS for ch in text):
        return "", "text_has_newline", "a line break inside the text (metadata.csv is one clip per line)"
    text = " ".join(text.split())
    if lowercase:
        text = text.lower()
    if not text:
        return "", "empty_text", "no text"
    return text, None, ""


def clean_speaker(raw: str) -> str:
    speaker = re.sub(r"[|\s]+", "_", unicodedata.normalize("NFC", str(raw)).strip())
    return speaker or "0"


def plan_rows(
    source: Source, settings: PrepareSettings, vocab: Vocabulary | None
) -> tuple[list[Planned], list[Skip], Counter, Counter | None]:
    """Apply every check that needs no audio; return (rows to convert, skipped, filtered counts, unknown
    chars). The unknown characters are counted here only with --drop_unknown_chars, over the rows dropped
    for them; rows kept with them are counted by the report, over the rows that pass the audio checks too."""
    planned: list[Planned] = []
    skipped: list[Skip] = []
    filtered: Counter = Counter()
    unknown_chars: Counter | None = Counter() if vocab is not None else None
    kept_with: dict[str, Candidate] = {}  # clip id -> the row kept with it (its origin, its source id)
    # as the rows' speakers are written: `--speaker "Ana Lopez"` is Ana_Lopez
    wanted_speakers = {clean_speaker(x) for x in settings.speakers} if settings.speakers else None
    for row in source.rows:
        if isinstance(row, Problem):
            skipped.append(
                Skip(safe_id(row.source_id) if row.source_id else "", row.origin, row.reason, row.detail)
            )
            continue
        if not row.source_id.strip():
            skipped.append(Skip("", row.origin, "bad_id", f"unusable id {row.source_id!r}"))
            continue
        clip_id = safe_id(row.source_id)
        holder = kept_with.get(clip_id)
        if not clip_id.strip("._-") or (holder is not None and holder.source_id != row.source_id):
            # an id in another script ('سڵاو' is '____'), or two that differ only there ('dîn', 'dên'):
            # the source id's digest keeps it apart
            clip_id = safe_id(row.source_id, tagged=True)
        if clip_id in kept_with:
            detail = (
                f"id {clip_id!r} (source id {row.source_id!r}) already used at {kept_with[clip_id].origin}"
            )
            skipped.append(Skip(clip_id, row.origin, "duplicate_id", detail))
            continue
        text, reason, detail = clean_text(row.text, settings.lowercase)
        if reason is not None:
            skipped.append(Skip(clip_id, row.origin, reason, detail))
            continue
        speaker = clean_speaker(row.speaker)
        if wanted_speakers is not None and speaker not in wanted_speakers:
            filtered["filtered_speaker"] += 1
            continue
        if settings.max_samples and len(planned) >= settings.max_samples:
            # before the vocabulary: a row past the limit is left out by it whatever its characters
            filtered["filtered_max_samples"] += 1
            continue
        if vocab is not None and unknown_chars is not None and settings.drop_unknown_chars:
            missing = vocab.unknown(text)
            if missing:
                unknown_chars.update(missing)
                chars = "".join(sorted(set(missing)))
                skipped.append(
                    Skip(clip_id, row.origin, "unknown_chars", f"not in the vocabulary: {chars!r}")
                )
                continue
        # claimed by the row kept only: a row rejected, left out by --speaker or dropped for its
        # characters leaves its id to a later one that is kept
        kept_with[clip_id] = row
        planned.append(Planned(clip_id, row, text, speaker))
    return planned, skipped, filtered, unknown_chars


# --- the output folder -------------------------------------------------------------------------------


def check_prepare_wavs(wavs_dir: Path, ids: list[str], old_state: dict, clean: bool) -> set[str]:
    """The ids of the WAVs this tool wrote into `wavs_dir` (listed in `.prepare_state.json`). Refuses,
    before anything is written, when a WAV it did not write would be replaced (same id) or deleted (--clean)."""
    owned = owned_ids(old_state)
    if not wavs_dir.is_dir():
        return owned
    foreign = {p.stem for p in wavs_dir.glob("*.wav")} - owned
    in_the_way = sorted(foreign & set(ids))
    if in_the_way:
        more = f" and {len(in_the_way) - 1} more" if len(in_the_way) > 1 else ""
        raise UserError(
            f"--data_dir: {wavs_dir / (in_the_way[0] + '.wav')}{more} would be replaced, but "
            f"{_not_written(wavs_dir, old_state)}; move it away or choose another --data_dir"
        )
    if clean and foreign:
        first = sorted(foreign)[0]
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"--clean: {wavs_dir / (first + '.wav')}{more} would be deleted, but "
            f"{_not_written(wavs_dir, old_state)}; move it away first, or run without --clean"
        )
    return owned


def _not_written(wavs_dir: Path, old_state: dict) -> str:
    """Why a WAV does not count as this tool's: not in the state, or a state that cannot be read."""
    if "damaged" in old_state:
        state = wavs_dir.parent / STATE_NAME
        return f"prepare_data.py cannot tell it wrote it ({state} is damaged: {old_state['damaged']})"
    return f"prepare_data.py did not write it (not in {STATE_NAME})"


def check_report_replaceable(report: Path) -> None:
    """Before anything is written: a `prepare_report.json` already there is an earlier run's (its
    counts and settings), else it is the user's and stays."""
    if not report.exists():
        return
    try:
        earlier = json.loads(report.read_text(encoding="utf-8"))
        ours = isinstance(earlier, dict) and {"counts", "settings"} <= set(earlier)
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise UserError(
            f"--data_dir: {report} would be replaced, but prepare_data.py did not write it (not a report of "
            "its own); move it away or choose another --data_dir"
        )


def check_prepare_sources(source, data_dir) -> None:
    """Before the source is read: the source folder/file is never an output."""
    path = Path(source).expanduser()
    if not path.exists():
        return  # a hub dataset id, or a missing path (open_source says so)
    s, d = resolved(path), resolved(data_dir)
    if s == d:
        refuse(
            "--source",
            source,
            s,
            "is the same folder as",
            "--data_dir",
            data_dir,
            d,
            "the source folder would be written over; write the training set somewhere else",
        )
    for part in DATA_PARTS:
        if inside(s, d / part):
            refuse(
                "--source",
                source,
                s,
                "is inside",
                "--data_dir",
                data_dir,
                d,
                f"{part} is written by prepare_data.py",
            )


def check_prepare_files(files: Iterable[tuple[str, Path]], data_dir, outputs: Iterable[str]) -> None:
    """Every source file (origin, path) against the files prepare writes: nothing in data_dir/wavs,
    nothing equal to an output file (`outputs`: names inside data_dir)."""
    d = resolved(data_dir)
    wavs = d / WAVS_DIR
    taken = {d / name for name in outputs}
    for origin, path in files:
        p = resolved(path)
        if inside(p, wavs) or p in taken:
            raise UserError(
                f"--source file {path} (= {p}, {origin}) is inside --data_dir {data_dir} (= {d}), where "
                f"prepare_data.py writes; it would be overwritten: copy the recordings elsewhere or choose "
                f"another --data_dir"
            )
