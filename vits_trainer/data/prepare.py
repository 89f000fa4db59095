"""prepare_data.py's engine: check every source row, convert the audio in parallel, write the training set.

Output: `<data_dir>/wavs/<id>.wav` (mono 16-bit PCM at the target rate), `<data_dir>/metadata.csv`
(`id|text|speaker`), `<data_dir>/prepare_report.json` (every skipped row and why, warnings, counts,
settings) and `<data_dir>/.prepare_state.json` (what each WAV was made from, so a re-run reuses it).

Order of checks for a row: parse (source reader) -> id -> text -> speaker filter -> vocabulary ->
--max_samples -> audio (missing, unreadable, empty, NaN/Inf, silent, duration). A failing row is
skipped and listed in the report with its reason; the run never stops for a bad row.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..hub import read_model_config, resolve_model_dir
from ..jsonfile import write_json_atomic
from ..safety import check_prepare_files, check_prepare_sources
from .audio import AudioReadError, audio_duration, is_temp_wav, read_audio, resample, write_wav
from .corpus import Candidate, Problem, Source, open_source
from .metadata import METADATA_NAME, WAVS_DIR, MetaRow, write_metadata

REPORT_NAME = "prepare_report.json"
STATE_NAME = ".prepare_state.json"
DEFAULT_SAMPLE_RATE = 16000
# Bump when the conversion changes, so WAVs made by an older version are re-made, not reused.
CONVERSION_VERSION = 1
# "Silent": peak below -50 dBFS or RMS below -60 dBFS. Real speech peaks far above -20 dBFS even when
# quiet; these only catch empty takes, muted channels and digital silence.
SILENCE_PEAK = 10 ** (-50 / 20)
SILENCE_RMS = 10 ** (-60 / 20)
# Clipping warning: more than 1% of samples at |x| >= 0.999. The clip is kept (it may still be usable).
CLIP_LEVEL = 0.999
CLIP_FRACTION = 0.01
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")  # what str.splitlines() splits on
MAX_ID_LENGTH = 120


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


@dataclass
class PrepareResult:
    data_dir: Path
    rows: list[MetaRow]
    report: dict
    report_path: Path


@dataclass(frozen=True)
class AudioTarget:
    """Everything that decides the bytes of an output WAV (the re-run reuse key) plus the duration limits."""

    sample_rate: int
    trim_top_db: float | None
    min_seconds: float
    max_seconds: float

    def key(self) -> dict:
        # Text options (--lowercase...) are not here: text is re-read from the source on every run.
        return {
            "version": CONVERSION_VERSION,
            "sample_rate": self.sample_rate,
            "trim_top_db": self.trim_top_db,
        }


@dataclass
class Job:
    clip_id: str
    out_path: str
    audio_path: str | None = None
    audio_bytes: bytes | None = None


@dataclass
class Outcome:
    clip_id: str
    reason: str | None = None  # None: converted (or reused) and kept
    detail: str = ""
    seconds: float = 0.0
    wav_size: int = 0
    clipped: float = 0.0  # fraction of samples at full scale


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


# --- public entry point ------------------------------------------------------------------------------


def prepare(settings: PrepareSettings, log: Callable[[str], None] = print) -> PrepareResult:
    """Run the whole preparation; raise UserError for bad input (nothing written) or when no row survives."""
    validate_settings(settings)
    data_dir = Path(settings.data_dir).expanduser()
    check_data_dir(data_dir)
    check_prepare_sources(settings.source, data_dir)  # the source is never an output (before reading it)
    sample_rate, vocab, model_notes = resolve_target(settings)
    source = open_source(
        settings.source,
        settings.format,
        split=settings.split,
        audio_column=settings.audio_column,
        text_column=settings.text_column,
        speaker_column=settings.speaker_column,
        id_column=settings.id_column,
        exclude=data_dir,
    )
    if source.folder is not None and source.folder.resolve() == data_dir.resolve():
        raise UserError(f"--data_dir {data_dir} is the source folder; write the training set somewhere else")
    # no source file may be written over: none inside data_dir/wavs, none equal to an output file
    check_prepare_files(
        ((c.origin, c.audio_path) for c in source.rows if getattr(c, "audio_path", None) is not None),
        data_dir,
        (METADATA_NAME, REPORT_NAME, STATE_NAME),
    )
    for note in source.notes + model_notes:
        log(f"note: {note}")

    planned, skipped, filtered, unknown_chars = plan_rows(source, settings, vocab)
    target = AudioTarget(
        sample_rate,
        settings.trim_top_db if settings.trim_silence else None,
        settings.min_seconds,
        settings.max_seconds,
    )
    wavs_dir = data_dir / WAVS_DIR
    old_state = load_state(data_dir)
    owned = check_prepare_wavs(wavs_dir, [p.clip_id for p in planned], old_state, settings.clean)
    wavs_dir.mkdir(parents=True, exist_ok=True)
    log(
        f"{len(source.rows)} source rows; {len(planned)} pass the text checks -> {wavs_dir} at {sample_rate} Hz"
    )
    run = convert_all(planned, source, target, wavs_dir, old_state, settings)

    rows: list[MetaRow] = []
    warnings: list[dict] = []
    durations: list[float] = []
    for item in planned:
        outcome = run.outcomes[item.clip_id]
        if outcome.reason is not None:
            skipped.append(Skip(item.clip_id, item.row.origin, outcome.reason, outcome.detail))
            continue
        rows.append(MetaRow(item.clip_id, item.text, item.speaker))
        durations.append(outcome.seconds)
        if outcome.clipped > CLIP_FRACTION:
            detail = f"{100 * outcome.clipped:.1f}% of samples at full scale"
            warnings.append(
                {"id": item.clip_id, "origin": item.row.origin, "warning": "clipping", "detail": detail}
            )

    kept_ids = {r.id for r in rows}
    unlisted = sorted(p for p in wavs_dir.glob("*.wav") if p.stem not in kept_ids)
    backup = metadata_backup_name(data_dir, old_state, source) if rows else None
    report = build_report(
        settings, source, sample_rate, vocab, rows, skipped, filtered, warnings, durations, unknown_chars
    )
    report["counts"].update(converted=run.converted, reused=run.reused, replaced_wavs=run.replaced)
    report["wavs"] = {
        "unlisted": len(unlisted) if not settings.clean else 0,
        "removed": len(unlisted) if settings.clean and rows else 0,
        "metadata_backup": str(backup) if backup else None,
    }
    report_path = data_dir / REPORT_NAME
    write_json_atomic(report_path, report)
    if not rows:
        log(format_summary(report, data_dir))
        reasons = ", ".join(f"{k} {v}" for k, v in report["counts"]["skipped_by_reason"].items()) or "none"
        raise UserError(f"no usable clips ({reasons}); see {report_path}")

    if backup is not None:  # another source's metadata.csv: moved to a fresh name, never overwritten
        os.replace(data_dir / METADATA_NAME, backup)
    # replaced only when the state says this tool wrote it from this same source (else backed up above)
    write_metadata(data_dir / METADATA_NAME, rows)  # last: it lists only WAVs already in place
    finish_wavs(wavs_dir, unlisted, settings.clean, log, owned | set(run.state))
    log(format_summary(report, data_dir))
    return PrepareResult(data_dir, rows, report, report_path)


# --- settings and inputs -----------------------------------------------------------------------------


def validate_settings(s: PrepareSettings) -> None:
    if s.sample_rate is not None and s.sample_rate <= 0:
        raise UserError(f"--sample_rate must be a positive number of Hz, got {s.sample_rate}")
    if s.min_seconds < 0:
        raise UserError(f"--min_seconds must be >= 0, got {s.min_seconds}")
    if s.max_seconds <= 0:
        raise UserError(f"--max_seconds must be > 0, got {s.max_seconds}")
    if s.min_seconds > s.max_seconds:
        raise UserError(f"--min_seconds {s.min_seconds} is greater than --max_seconds {s.max_seconds}")
    if s.max_samples < 0:
        raise UserError(f"--max_samples must be >= 0 (0 = all), got {s.max_samples}")
    if s.trim_top_db <= 0:
        raise UserError(f"--trim_top_db must be > 0, got {s.trim_top_db}")
    if s.num_workers < 0:
        raise UserError(f"--num_workers must be >= 0, got {s.num_workers}")


def check_data_dir(data_dir: Path) -> None:
    """Fail early (before anything is written) when `data_dir` cannot be created or written."""
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: exists and is not a folder")
    wavs = data_dir / WAVS_DIR
    if wavs.exists() and not wavs.is_dir():
        raise UserError(f"--data_dir {data_dir}: {wavs} exists and is not a folder")
    existing = data_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--data_dir {data_dir}: cannot be created ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--data_dir {data_dir}: {existing} is not writable")


def resolve_target(settings: PrepareSettings) -> tuple[int, Vocabulary | None, list[str]]:
    """Target sample rate (flag, else the model's, else 16 kHz) and the model's vocabulary, if any."""
    if settings.model_name is None:
        return settings.sample_rate or DEFAULT_SAMPLE_RATE, None, []
    model_dir = resolve_model_dir(settings.model_name)
    model_rate = int(read_model_config(model_dir).get("sampling_rate") or DEFAULT_SAMPLE_RATE)
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
    try:
        symbols = set(json.loads(vocab_file.read_text(encoding="utf-8")))
        config_file = model_dir / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    except (OSError, ValueError) as err:
        raise UserError(f"{vocab_file}: unreadable tokenizer files ({err})") from None
    if config.get("is_uroman") or config.get("phonemize"):
        how = "romanises (uroman)" if config.get("is_uroman") else "phonemizes"
        return None, [f"the model's tokenizer {how} text first: character check skipped"]
    return Vocabulary(symbols, bool(config.get("normalize", True))), []


# --- row checks ---------------------------------------------------------------------------------------


def safe_id(source_id: str) -> str:
    """A filesystem-safe id: [A-Za-z0-9_.-] only, no leading dot, at most MAX_ID_LENGTH characters."""
    clip_id = re.sub(r"[^A-Za-z0-9_.-]", "_", source_id.strip())
    if clip_id.startswith("."):
        clip_id = "_" + clip_id[1:]
    if len(clip_id) > MAX_ID_LENGTH:
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
    """Apply every check that needs no audio; return (rows to convert, skipped, filtered counts, unknown chars)."""
    planned: list[Planned] = []
    skipped: list[Skip] = []
    filtered: Counter = Counter()
    unknown_chars: Counter | None = Counter() if vocab is not None else None
    first_origin: dict[str, str] = {}
    wanted_speakers = set(settings.speakers) if settings.speakers else None
    for row in source.rows:
        if isinstance(row, Problem):
            skipped.append(
                Skip(safe_id(row.source_id) if row.source_id else "", row.origin, row.reason, row.detail)
            )
            continue
        clip_id = safe_id(row.source_id)
        if not clip_id.strip("._-"):
            skipped.append(Skip(clip_id, row.origin, "bad_id", f"unusable id {row.source_id!r}"))
            continue
        if clip_id in first_origin:
            detail = f"id {clip_id!r} (source id {row.source_id!r}) already used at {first_origin[clip_id]}"
            skipped.append(Skip(clip_id, row.origin, "duplicate_id", detail))
            continue
        first_origin[clip_id] = row.origin
        text, reason, detail = clean_text(row.text, settings.lowercase)
        if reason is not None:
            skipped.append(Skip(clip_id, row.origin, reason, detail))
            continue
        speaker = clean_speaker(row.speaker)
        if wanted_speakers is not None and speaker not in wanted_speakers:
            filtered["filtered_speaker"] += 1
            continue
        if vocab is not None and unknown_chars is not None:
            missing = vocab.unknown(text)
            unknown_chars.update(missing)
            if missing and settings.drop_unknown_chars:
                chars = "".join(sorted(set(missing)))
                skipped.append(
                    Skip(clip_id, row.origin, "unknown_chars", f"not in the vocabulary: {chars!r}")
                )
                continue
        if settings.max_samples and len(planned) >= settings.max_samples:
            filtered["filtered_max_samples"] += 1
            continue
        planned.append(Planned(clip_id, row, text, speaker))
    return planned, skipped, filtered, unknown_chars


# --- audio conversion (runs in worker processes) -----------------------------------------------------


def convert_clip(job: Job, target: AudioTarget) -> Outcome:
    """Decode, check, resample and write one clip. Never raises for bad audio; OSError on write propagates."""
    out = Outcome(job.clip_id)
    if job.audio_bytes is not None:
        if not job.audio_bytes:
            return _failed(out, "empty_audio", "0 bytes")
        source: str | bytes = job.audio_bytes
    else:
        path = Path(job.audio_path or "")
        if not path.is_file():
            return _failed(out, "missing_audio", f"{path}: no such file")
        if path.stat().st_size == 0:
            return _failed(out, "empty_audio", f"{path}: 0 bytes")
        if target.trim_top_db is None:
            # Long-form audio (an hour-long file) is rejected from its header, without decoding it all.
            seconds = audio_duration(path)
            if seconds is not None and seconds > target.max_seconds * 1.1 + 1.0:
                return _failed(out, "too_long", f"{seconds:.2f} s > {target.max_seconds} s")
        source = str(path)
    try:
        audio, rate = read_audio(source)
    except AudioReadError as err:
        return _failed(out, "unreadable_audio", str(err))
    try:
        return _check_and_write(out, audio, rate, job, target)
    except OSError:
        raise
    except Exception as err:  # an odd file tripping numpy/soxr must cost one row, not the run
        return _failed(out, "unreadable_audio", f"{type(err).__name__}: {err}")


def _check_and_write(out: Outcome, audio: np.ndarray, rate: int, job: Job, target: AudioTarget) -> Outcome:
    if audio.shape[0] == 0:
        return _failed(out, "empty_audio", "no samples")
    finite = np.isfinite(audio)
    if not finite.all():
        return _failed(out, "nan_or_inf", f"{int((~finite).sum())} NaN/Inf samples")
    magnitude = np.abs(audio)
    peak = float(magnitude.max())
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    if peak < SILENCE_PEAK or rms < SILENCE_RMS:
        return _failed(out, "silent", f"peak {_dbfs(peak):.1f} dBFS, RMS {_dbfs(rms):.1f} dBFS")
    out.clipped = float(np.mean(magnitude >= CLIP_LEVEL))
    if target.trim_top_db is not None:
        import librosa  # only for --trim_silence: importing it costs about a second per worker

        audio, _ = librosa.effects.trim(audio, top_db=target.trim_top_db)
    seconds = audio.shape[0] / rate
    reason = duration_problem(seconds, target)
    if reason is not None:
        return _failed(out, reason, f"{seconds:.2f} s outside [{target.min_seconds}, {target.max_seconds}] s")
    converted = resample(audio, rate, target.sample_rate)
    out.wav_size = write_wav(job.out_path, converted, target.sample_rate)
    out.seconds = converted.shape[0] / target.sample_rate
    return out


def duration_problem(seconds: float, target: AudioTarget) -> str | None:
    if seconds < target.min_seconds:
        return "too_short"
    if seconds > target.max_seconds:
        return "too_long"
    return None


def convert_chunk(jobs: list[Job], target: AudioTarget) -> list[Outcome]:
    return [convert_clip(job, target) for job in jobs]


def _failed(out: Outcome, reason: str, detail: str) -> Outcome:
    out.reason, out.detail = reason, detail
    return out


def _dbfs(x: float) -> float:
    return 20 * math.log10(max(x, 1e-10))


# --- parallel run with reuse of earlier results ------------------------------------------------------


@dataclass
class RunResult:
    outcomes: dict[str, Outcome]
    state: dict[str, dict]
    converted: int = 0
    reused: int = 0
    replaced: int = 0


def convert_all(
    planned: list[Planned],
    source: Source,
    target: AudioTarget,
    wavs_dir: Path,
    old_state: dict,
    settings: PrepareSettings,
) -> RunResult:
    """Convert every planned row (reusing WAVs whose source and settings are unchanged); keep order-free results.

    Rows go out in chunks, with at most two chunks per worker in flight, so audio held as bytes in a
    dataset is fetched a chunk at a time instead of all at once.
    """
    from tqdm import tqdm

    old_clips = old_state.get("clips", {})
    state = {k: v for k, v in old_clips.items() if (wavs_dir / f"{k}.wav").is_file()}
    run = RunResult({}, state)
    workers = max(1, settings.num_workers)
    chunk = max(1, min(32, math.ceil(len(planned) / (workers * 4))))
    pending_fingerprints: dict[str, dict] = {}
    # The pool starts before the progress bar: tqdm's monitor thread should not exist when workers fork.
    pool = (
        ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context())
        if workers > 1 and len(planned) > chunk
        else None
    )
    bar = tqdm(total=len(planned), unit="clip", desc="preparing", disable=None if settings.progress else True)
    in_flight: set[Future] = set()

    def collect(outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            run.outcomes[outcome.clip_id] = outcome
            fingerprint = pending_fingerprints.pop(outcome.clip_id)
            if outcome.reason is None:
                run.converted += 1
                run.state[outcome.clip_id] = {
                    "source": fingerprint,
                    "target": target.key(),
                    "wav_size": outcome.wav_size,
                    "seconds": outcome.seconds,
                    "clipped": outcome.clipped,
                }
        bar.update(len(outcomes))

    def drain(limit: int) -> None:
        while len(in_flight) > limit:
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                in_flight.discard(future)
                collect(future.result())

    try:
        for start in range(0, len(planned), chunk):
            block = planned[start : start + chunk]
            jobs = _block_jobs(block, source, target, wavs_dir, old_clips, run, pending_fingerprints)
            bar.update(len(block) - len(jobs))
            if not jobs:
                continue
            if pool is None:
                collect(convert_chunk(jobs, target))
            else:
                in_flight.add(pool.submit(convert_chunk, jobs, target))
                drain(2 * workers)
        drain(0)
    except BrokenProcessPool:
        raise UserError(
            "a worker process died (out of memory, or a crash decoding a file); "
            "re-run with --num_workers 1 to find the file"
        ) from None
    except OSError as err:
        raise UserError(f"writing to {wavs_dir} failed: {err}") from None
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        # Saved even when interrupted: the WAVs finished so far are reused by the next run.
        save_state(wavs_dir.parent, source, run.state)
    return run


def _pool_context():
    """fork on Linux: workers start at once and never re-import the caller's __main__ (which `spawn`
    does, breaking scripts without a main guard and `python -` input). Elsewhere the platform default."""
    if sys.platform.startswith("linux"):
        return get_context("fork")
    return get_context()


def _block_jobs(
    block: list[Planned],
    source: Source,
    target: AudioTarget,
    wavs_dir: Path,
    old_clips: dict,
    run: RunResult,
    pending: dict[str, dict],
) -> list[Job]:
    """Fingerprint each row's source; settle missing files and reusable WAVs here, return the rest as jobs."""
    keys = [p.row.audio_key for p in block if p.row.audio_key is not None]
    fetched = dict(zip(keys, source.fetch_audio(keys), strict=True)) if keys and source.fetch_audio else {}
    jobs = []
    for item in block:
        out_path = wavs_dir / f"{item.clip_id}.wav"
        blob: bytes | None = None
        if item.row.audio_key is not None:
            blob = fetched.get(item.row.audio_key) or b""
            fingerprint = {"blake2b": hashlib.blake2b(blob, digest_size=16).hexdigest()}
        else:
            path = item.row.audio_path
            try:
                stat = path.stat() if path is not None else None
            except OSError:
                stat = None
            if stat is None or not path.is_file():
                run.outcomes[item.clip_id] = Outcome(item.clip_id, "missing_audio", f"{path}: no such file")
                continue
            fingerprint = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        previous = old_clips.get(item.clip_id)
        if _reusable(previous, fingerprint, target, out_path):
            seconds = float(previous["seconds"])
            reason = duration_problem(seconds, target)
            detail = (
                f"{seconds:.2f} s outside [{target.min_seconds}, {target.max_seconds}] s" if reason else ""
            )
            run.outcomes[item.clip_id] = Outcome(
                item.clip_id,
                reason,
                detail,
                seconds,
                int(previous["wav_size"]),
                float(previous.get("clipped", 0)),
            )
            run.reused += reason is None
            continue
        if previous is None and out_path.exists():
            run.replaced += 1  # a WAV this tool did not record (another source, or made by hand)
        pending[item.clip_id] = fingerprint
        audio_path = str(item.row.audio_path) if item.row.audio_path is not None else None
        jobs.append(Job(item.clip_id, str(out_path), audio_path, blob))
    return jobs


def _reusable(previous: dict | None, fingerprint: dict, target: AudioTarget, out_path: Path) -> bool:
    if not previous or previous.get("source") != fingerprint or previous.get("target") != target.key():
        return False
    try:
        return out_path.stat().st_size == previous.get("wav_size")
    except OSError:
        return False


# --- state, report, output folder --------------------------------------------------------------------


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


def metadata_backup_name(data_dir: Path, old_state: dict, source: Source) -> Path | None:
    """Where to move an existing metadata.csv that this tool did not write from this same source."""
    meta = data_dir / METADATA_NAME
    if not meta.is_file() or old_state.get("source") == source.location:
        return None
    for n in range(1, 1000):
        backup = data_dir / f"{METADATA_NAME}.bak{'' if n == 1 else n}"
        if not backup.exists():
            return backup
    return None


def check_prepare_wavs(wavs_dir: Path, ids: list[str], old_state: dict, clean: bool) -> set[str]:
    """The ids of the WAVs this tool wrote into `wavs_dir` (listed in `.prepare_state.json`). Refuses,
    before anything is written, when a WAV it did not write would be replaced (same id) or deleted (--clean)."""
    owned = set(old_state.get("clips", {}))
    if not wavs_dir.is_dir():
        return owned
    foreign = {p.stem for p in wavs_dir.glob("*.wav")} - owned
    in_the_way = sorted(foreign & set(ids))
    if in_the_way:
        more = f" and {len(in_the_way) - 1} more" if len(in_the_way) > 1 else ""
        raise UserError(
            f"--data_dir: {wavs_dir / (in_the_way[0] + '.wav')}{more} would be replaced, but prepare_data.py "
            f"did not write it (not in {STATE_NAME}); move it away or choose another --data_dir"
        )
    if clean and foreign:
        first = sorted(foreign)[0]
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"--clean: {wavs_dir / (first + '.wav')}{more} would be deleted, but prepare_data.py did not write "
            f"it (not in {STATE_NAME}); move it away first, or run without --clean"
        )
    return owned


def finish_wavs(
    wavs_dir: Path,
    unlisted: list[Path],
    clean: bool,
    log: Callable[[str], None],
    owned: set[str] | None = None,
) -> None:
    for tmp in wavs_dir.glob(".*.tmp"):
        if is_temp_wav(tmp):
            tmp.unlink(missing_ok=True)  # left by an interrupted run: ours, never user data
    if not unlisted:
        return
    if clean:
        for p in unlisted:
            # --clean deletes only WAVs this tool wrote (state); check_prepare_wavs refused any other
            if owned is None or p.stem in owned:
                p.unlink(missing_ok=True)
        log(f"removed {len(unlisted)} WAV(s) in {wavs_dir} not listed in metadata.csv (--clean)")
    else:
        log(
            f"{len(unlisted)} WAV(s) in {wavs_dir} are not listed in metadata.csv (left alone; --clean removes them)"
        )


def build_report(
    settings: PrepareSettings,
    source: Source,
    sample_rate: int,
    vocab: Vocabulary | None,
    rows: list[MetaRow],
    skipped: list[Skip],
    filtered: Counter,
    warnings: list[dict],
    durations: list[float],
    unknown_chars: Counter | None,
) -> dict:
    by_reason = Counter(s.reason for s in skipped)
    settings_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    settings_dict["resolved_sample_rate"] = sample_rate
    total = sum(durations)
    return {
        "source": {"location": source.location, "format": source.format, "notes": source.notes},
        "settings": settings_dict,
        "counts": {
            "source_rows": len(source.rows),
            "kept": len(rows),
            "skipped": len(skipped),
            "filtered": sum(filtered.values()),
            "warnings": len(warnings),
            "skipped_by_reason": dict(by_reason.most_common()),
            "filtered_by_reason": dict(filtered.most_common()),
        },
        "durations": {
            "total_seconds": round(total, 3),
            "total_hours": round(total / 3600, 4),
            "min_seconds": round(min(durations), 3) if durations else None,
            "median_seconds": round(statistics.median(durations), 3) if durations else None,
            "max_seconds": round(max(durations), 3) if durations else None,
        },
        "speakers": dict(Counter(r.speaker for r in rows).most_common()),
        "characters": dict(Counter(ch for r in rows for ch in r.text).most_common()),
        "unknown_characters": dict(unknown_chars.most_common()) if unknown_chars is not None else None,
        "skipped_rows": [asdict(s) for s in skipped],
        "warnings": warnings,
    }


def format_summary(report: dict, data_dir: Path) -> str:
    counts, d = report["counts"], report["durations"]
    lines = [
        f"kept {counts['kept']} of {counts['source_rows']} rows in {data_dir} "
        f"({counts.get('converted', 0)} converted, {counts.get('reused', 0)} reused from an earlier run)"
    ]
    if counts["kept"]:
        lines.append(
            f"  audio: {d['total_hours']:.3f} h; clip duration min {d['min_seconds']:.2f} s, "
            f"median {d['median_seconds']:.2f} s, max {d['max_seconds']:.2f} s"
        )
    lines.append(f"  skipped {counts['skipped']}: {_counts(counts['skipped_by_reason']) or '-'}")
    if counts["filtered"]:
        lines.append(f"  filtered {counts['filtered']}: {_counts(counts['filtered_by_reason'])}")
    if report["warnings"]:
        kinds = Counter(w["warning"] for w in report["warnings"])
        lines.append(f"  warnings (kept) {len(report['warnings'])}: {_counts(dict(kinds))}")
    if counts.get("replaced_wavs"):
        lines.append(
            f"  replaced {counts['replaced_wavs']} WAV(s) already in wavs/ that no earlier run recorded"
        )
    speakers = report["speakers"]
    lines.append(f"  speakers ({len(speakers)}): {_counts(speakers, limit=20)}")
    chars = report["characters"]
    lines.append(f"  characters ({len(chars)}): {_counts({repr(k): v for k, v in chars.items()}, limit=80)}")
    unknown = report["unknown_characters"]
    if unknown == {}:
        lines.append("  every character is in the model's vocabulary")
    elif unknown:
        action = (
            "rows dropped"
            if report["settings"]["drop_unknown_chars"]
            else "rows kept; --drop_unknown_chars drops them"
        )
        shown = _counts({repr(k): v for k, v in unknown.items()}, limit=80)
        lines.append(f"  not in the model's vocabulary ({action}; the tokenizer would drop them): {shown}")
    if report["wavs"].get("metadata_backup"):
        lines.append(
            f"  the previous metadata.csv (another source) was moved to {report['wavs']['metadata_backup']}"
        )
    lines.append(f"  report: {data_dir / REPORT_NAME}")
    return "\n".join(lines)


def _counts(counter: dict, limit: int = 0) -> str:
    items = list(counter.items())
    text = ", ".join(f"{k} {v}" for k, v in (items[:limit] if limit else items))
    return text + (f", ... ({len(items) - limit} more)" if limit and len(items) > limit else "")


def default_workers() -> int:
    return os.cpu_count() or 1
