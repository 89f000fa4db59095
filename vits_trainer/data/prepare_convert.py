"""prepare_data.py's conversion: decode, check, resample and write each clip as a WAV, in parallel.

Each clip is converted in a worker process, so the checks that need the decoded audio (empty,
NaN/Inf, silent, duration) are made here. `.prepare_state.json` records what each WAV was made from,
so a re-run with the same source and settings reuses it instead of converting again (prepare_state.py).
"""

from __future__ import annotations

import hashlib
import math
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError
from ..terminal import clock_text, is_interactive
from .audio import (
    AudioReadError,
    audio_duration,
    read_audio,
    resample,
    wav_data_chunk,
    wav_header_seconds,
    write_wav,
)
from .corpus_rows import Source
from .prepare_state import claim, save_state

if TYPE_CHECKING:
    from .prepare_checks import Planned
    from .prepare_settings import PrepareSettings

# Bump when the conversion changes, so WAVs made by an older version are re-made, not reused.
CONVERSION_VERSION = 1
# "Silent": peak below -50 dBFS or RMS below -60 dBFS. Real speech peaks far above -20 dBFS even when
# quiet; these only catch empty takes, muted channels and digital silence.
SILENCE_PEAK = 10 ** (-50 / 20)
SILENCE_RMS = 10 ** (-60 / 20)
# Clipping warning: more than 1% of samples at |x| >= 0.999. The clip is kept (it may still be usable).
CLIP_LEVEL = 0.999
CLIP_FRACTION = 0.01


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
    source_rate: int = 0  # the decoded file's rate (0: unknown, a clip reused from an older state)
    header_seconds: float = 0.0  # what the file's header promised (0: unknown): a cut file decodes shorter
    decoded_seconds: float = 0.0

    # what a converted clip's state keeps, so that a re-run reusing its WAV has the same figures and warnings
    KEPT = ("wav_size", "seconds", "clipped", "source_rate", "header_seconds", "decoded_seconds")

    def kept(self) -> dict:
        return {name: getattr(self, name) for name in self.KEPT}

    @classmethod
    def reused(cls, clip_id: str, reason: str | None, detail: str, previous: dict) -> Outcome:
        """The outcome of a WAV reused as an earlier run left it (`previous`: its state; a state from
        before a figure was kept has its default, 0)."""
        kept = {name: type(getattr(cls, name))(previous.get(name, 0)) for name in cls.KEPT}
        return cls(clip_id, reason, detail, **kept)


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
        seconds = audio_duration(path)
        # a WAV cut short: libsndfile's length is that of the samples present, its header's is longer
        out.header_seconds = max(seconds or 0.0, wav_header_seconds(path) or 0.0)
        # Long-form audio (an hour-long file) is rejected from its header, without decoding it all.
        if target.trim_top_db is None and seconds is not None and seconds > target.max_seconds * 1.1 + 1.0:
            return _failed(out, "too_long", f"{seconds:.2f} s > {target.max_seconds} s")
        source = str(path)
    try:
        audio, rate = read_audio(source)
    except AudioReadError as err:
        return _failed(out, "unreadable_audio", str(err))
    out.decoded_seconds = audio.shape[0] / rate if rate else 0.0
    try:
        return _check_and_write(out, audio, rate, job, target)
    except OSError:
        raise
    except Exception as err:  # an odd file tripping numpy/soxr must cost one row, not the run
        return _failed(out, "unreadable_audio", f"{type(err).__name__}: {err}")


def _check_and_write(out: Outcome, audio: np.ndarray, rate: int, job: Job, target: AudioTarget) -> Outcome:
    if audio.shape[0] == 0:
        return _failed(out, "empty_audio", _no_samples(job.audio_path))
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
    out.source_rate = int(rate)
    reason = duration_problem(seconds, target)
    if reason is not None:
        return _failed(out, reason, duration_detail(seconds, target))
    converted = resample(audio, rate, target.sample_rate)
    # checked again as kept, and as a re-run reusing the WAV checks it: resampled, a clip's length moves
    # by up to half a sample (1.25 s at 44.1 kHz is 27563 samples at 22050 Hz, 1.25002 s)
    seconds = converted.shape[0] / target.sample_rate
    reason = duration_problem(seconds, target)
    if reason is not None:
        return _failed(out, reason, duration_detail(seconds, target))
    out.wav_size = write_wav(job.out_path, converted, target.sample_rate)
    out.seconds = seconds
    return out


def _no_samples(audio_path: str | None) -> str:
    """Why a file decoded to no samples: a WAV whose header says none while bytes follow it is a
    recording never finished (its header's sizes are written last), not an empty take."""
    chunk = wav_data_chunk(audio_path) if audio_path else None
    if chunk is not None and chunk[0] == 0:
        try:
            after = Path(audio_path).stat().st_size - chunk[3]
        except OSError:  # gone meanwhile: an error here would read as one writing the output
            after = 0
        if after > 0:
            return (
                f"no samples: its header gives a data size of 0, yet {after} bytes follow it (a recording "
                "whose header was never finished?)"
            )
    return "no samples"


def duration_problem(seconds: float, target: AudioTarget) -> str | None:
    if seconds < target.min_seconds:
        return "too_short"
    if seconds > target.max_seconds:
        return "too_long"
    return None


def duration_detail(seconds: float, target: AudioTarget) -> str:
    """Why `seconds` is outside the limits, with the digits that show it (1.250023 s, not 1.25 s)."""
    shown = f"{seconds:.2f}"
    if target.min_seconds <= float(shown) <= target.max_seconds:
        shown = f"{seconds:.6f}"
    return f"{shown} s outside [{target.min_seconds}, {target.max_seconds}] s"


def convert_chunk(jobs: list[Job], target: AudioTarget) -> list[Outcome]:
    return [convert_clip(job, target) for job in jobs]


def _failed(out: Outcome, reason: str, detail: str) -> Outcome:
    out.reason, out.detail = reason, detail
    return out


def _dbfs(x: float) -> float:
    return 20 * math.log10(max(x, 1e-10))


# --- progress off a terminal ---------------------------------------------------------------------------


class ProgressLines:
    """Where the bar is off (a notebook cell, `| tee log`), a plain line at most every `every` seconds,
    `preparing: 1,200 of 13,100 clips (9 %), 0:45 so far, about 7:30 left`, so a long conversion is seen
    to go on. None in a run done within the first interval (its log stays the first line and the
    summary), none for the last clip (the summary follows)."""

    def __init__(
        self,
        total: int,
        log: Callable[[str], None],
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.log, self.every, self.clock = total, log, every, clock
        self.start = clock()
        self.due = self.start + every
        self.done = 0
        self.settled = 0  # rows settled without converting (reused WAVs, missing files): no rate

    def update(self, finished: int, settled: int = 0) -> None:
        """`finished` clips converted (or failed converting), `settled` rows done without converting."""
        self.done += finished + settled
        self.settled += settled
        now = self.clock()
        if now < self.due or self.done >= self.total:
            return
        self.due = now + self.every
        elapsed = now - self.start
        line = (
            f"preparing: {self.done:,} of {self.total:,} clips ({100 * self.done // self.total} %), "
            f"{clock_text(round(elapsed))} so far"
        )
        if self.done > self.settled:  # the rows left at the rate of those converted so far
            left = elapsed / (self.done - self.settled) * (self.total - self.done)
            line += f", about {clock_text(round(left))} left"
        self.log(line)


# --- parallel run with reuse of earlier results ------------------------------------------------------


@dataclass
class RunResult:
    outcomes: dict[str, Outcome]
    state: dict[str, dict]
    converted: int = 0
    reused: int = 0
    replaced: int = 0
    begun: set[str] = field(default_factory=set)  # WAVs begun, never collected (interrupted): still ours
    written: set[str] = field(default_factory=set)  # the clips whose WAVs this run wrote


def convert_all(
    planned: list[Planned],
    source: Source,
    target: AudioTarget,
    wavs_dir: Path,
    old_state: dict,
    settings: PrepareSettings,
    metadata_source: str | None = None,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Convert every planned row (reusing WAVs whose source and settings are unchanged); keep order-free results.

    `metadata_source`: the source the metadata.csv in place was written from, kept in the state.
    `log`: where progress lines go off a terminal, where the bar is off (ProgressLines).
    Rows go out in chunks, with at most two chunks per worker in flight, so audio held as bytes in a
    dataset is fetched a chunk at a time instead of all at once.
    """
    from tqdm import tqdm

    old_clips = old_state.get("clips", {})
    state = {k: v for k, v in old_clips.items() if (wavs_dir / f"{k}.wav").is_file()}
    run = RunResult({}, state)
    # WAVs an earlier run began: this tool's until converted again (or left, still listed as begun)
    claimed = {k for k in old_state.get("claimed") or [] if (wavs_dir / f"{k}.wav").is_file()}
    workers = max(1, settings.num_workers)
    chunk = max(1, min(32, math.ceil(len(planned) / (workers * 4))))
    pending_fingerprints: dict[str, dict] = {}
    # The pool starts before the progress bar: tqdm's monitor thread should not exist when workers fork.
    pool = (
        ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context(), initializer=_worker_start)
        if workers > 1 and len(planned) > chunk
        else None
    )
    shown = settings.progress and is_interactive()  # a bar on a terminal only, as training's
    bar = tqdm(total=len(planned), unit="clip", desc="preparing", disable=not shown)
    lines = ProgressLines(len(planned), log) if settings.progress and not shown else None

    def advance(finished: int, settled: int = 0) -> None:
        bar.update(finished + settled)
        if lines is not None and finished + settled:
            lines.update(finished, settled)

    in_flight: set[Future] = set()

    def collect(outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            run.outcomes[outcome.clip_id] = outcome
            fingerprint = pending_fingerprints.pop(outcome.clip_id)
            if outcome.reason is None:
                run.converted += 1
                run.written.add(outcome.clip_id)
                run.state[outcome.clip_id] = {"source": fingerprint, "target": target.key(), **outcome.kept()}
        advance(len(outcomes))

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
            advance(0, len(block) - len(jobs))
            if not jobs:
                continue
            ids = [job.clip_id for job in jobs]
            claim(wavs_dir.parent, ids)  # before a WAV is written: a killed run leaves them named
            claimed.update(ids)
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
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            # interrupted: chunks the workers finished meanwhile are kept, not converted again next run
            for future in in_flight:
                if future.done() and not future.cancelled() and future.exception() is None:
                    collect(future.result())
        bar.close()
        # Saved even when interrupted: the WAVs finished so far are reused by the next run, and those
        # begun but never collected stay known as this tool's (claimed)
        run.begun = {k for k in claimed - set(run.state) if (wavs_dir / f"{k}.wav").is_file()}
        save_state(wavs_dir.parent, source, run.state, run.begun, metadata_source)
    return run


def _worker_start() -> None:
    """A conversion worker leaves stopping to the main process: Ctrl-C (sent to the whole process
    group) is ignored, so the main process saves its state and stops the pool, and SIGTERM ends the
    worker as by default. It also ends when the main process dies (Linux), instead of converting on
    alone after a `kill PID` of the main process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the worker ends with its chunk
            pass


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
            detail = duration_detail(seconds, target) if reason else ""
            run.outcomes[item.clip_id] = Outcome.reused(item.clip_id, reason, detail, previous)
            run.reused += reason is None
            continue
        if previous is None and out_path.exists():
            run.replaced += 1  # begun by an interrupted run (check_prepare_wavs refused any other)
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
