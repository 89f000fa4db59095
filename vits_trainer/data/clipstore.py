"""The clip store: every clip of a data_dir preloaded as int16, and its packed on-disk cache.

Reading WAVs from disk per sample starves a GPU (bench/bench_train.py loader), so all clips are loaded once at
start into one int16 array (half the RAM of float32) with offsets. The array is built once into a
packed cache (`audio_int16.bin` + `index.json`) so the next start is a single sequential read, or a
memory map when the set does not fit in RAM. Tokenizing and batching live in items.py, sampler.py
and loader.py; spectrograms are made by the trainer on the device per batch.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from ..errors import UserError
from ..launch import local_processes
from ..runlock import refuse_if_being_written
from ..terminal import is_interactive
from .metadata import METADATA_NAME, WAVS_DIR, MetaRow, read_metadata
from .prepare_state import REPORT_NAME, made_by_prepare

CACHE_VERSION = 1  # bump when the cache layout or the decoding changes: old caches then rebuild
AUDIO_NAME = "audio_int16.bin"
INDEX_NAME = "index.json"
CACHE_MARK = ".vits_trainer_cache"  # written first into every clip cache: a cache/ without it is not ours
BYTES_PER_SAMPLE = 2
RAM_FRACTION = 0.75  # of available RAM when max_ram_gb is not given: the model needs the rest
MAX_READ_THREADS = 8

Log = Callable[[str], Any]


# ---------------------------------------------------------------------------------------------------
# The clip store


@dataclass
class ClipStore:
    """All clips of a data_dir: audio as one int16 array plus offsets, and the metadata per clip."""

    ids: list[str]
    texts: list[str]
    speakers: list[str]
    offsets: np.ndarray  # int64 [N+1]; clip i is audio[offsets[i]:offsets[i+1]]
    audio: np.ndarray  # int16 [total_samples]; an np.memmap when not preloaded
    sample_rate: int

    def clip(self, i: int) -> np.ndarray:
        """int16 view of clip i (no copy)."""
        return self.audio[self.offsets[i] : self.offsets[i + 1]]

    def num_samples(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def lengths(self) -> np.ndarray:
        """Samples per clip, int64 [N]."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def seconds(self) -> float:
        return float(self.offsets[-1]) / self.sample_rate

    @property
    def in_ram(self) -> bool:
        return not isinstance(self.audio, np.memmap)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling a memmap would copy the whole file into the pickle (spawned DataLoader workers);
        # send its path instead and map it again on the other side.
        state = self.__dict__.copy()
        if isinstance(self.audio, np.memmap) and self.audio.filename is not None:
            state["audio"] = ("memmap", str(self.audio.filename), int(self.audio.offset), len(self.audio))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        audio = state["audio"]
        if isinstance(audio, tuple) and audio and audio[0] == "memmap":
            _, path, offset, length = audio
            state["audio"] = np.memmap(path, dtype=np.int16, mode="r", offset=offset, shape=(length,))
        self.__dict__.update(state)


@dataclass
class LoadReport:
    clips: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, reason)
    resampled: int = 0
    hours: float = 0.0
    bytes: int = 0  # of the int16 audio
    cache_hit: bool = False
    seconds: float = 0.0  # wall time of the whole load
    in_ram: bool = True
    metadata_problems: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)
    cache_path: str | None = None  # None when no cache could be written
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["skipped"] = [list(s) for s in self.skipped]
        d["metadata_problems"] = [list(p) for p in self.metadata_problems]
        return d


def _wav_path(data_dir: Path, clip_id: str) -> Path:
    return data_dir / WAVS_DIR / f"{clip_id}.wav"


def _wav_stats(wav_paths: list[Path]) -> list[tuple[int, int] | None]:
    """(size, mtime_ns) of each wav, None when it cannot be read: what a cache's fingerprint knows of the
    audio. stat is ~1000x cheaper than reading, and a rewritten file changes its mtime."""
    stats: list[tuple[int, int] | None] = []
    for path in wav_paths:
        try:
            st = os.stat(path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
    return stats


def _hash_start(sample_rate: int):
    h = hashlib.sha256()
    h.update(f"vits-trainer clip cache v{CACHE_VERSION} sr={sample_rate}\n".encode())
    return h


def _stat_line(stat: tuple[int, int] | None) -> bytes:
    return f"{stat[0]}:{stat[1]}\n".encode() if stat is not None else b"missing\n"


def _fingerprint(rows: list[MetaRow], stats: list[tuple[int, int] | None], sample_rate: int) -> str:
    """Hash of everything the cached audio depends on: the clips' ids in order and their wavs' stats,
    not metadata.csv's bytes (texts and speakers are read from the listing at every start, so an edited
    transcript does not re-read every wav)."""
    h = _hash_start(sample_rate)
    for row, stat in zip(rows, stats, strict=True):
        h.update(f"{row.id}\0".encode())
        h.update(_stat_line(stat))
    return h.hexdigest()


def _previous_fingerprint(meta_path: Path, stats: list[tuple[int, int] | None], sample_rate: int) -> str:
    """The fingerprint caches were written with before 2895b3e (metadata.csv's bytes, not the ids): such a
    cache still holds the audio of these clips while metadata.csv is unchanged, and a data folder attached
    read-only can never rebuild it (every start re-read the wavs, all of them into RAM)."""
    h = _hash_start(sample_rate)
    h.update(hashlib.sha256(meta_path.read_bytes()).digest())
    for stat in stats:
        h.update(_stat_line(stat))
    return h.hexdigest()


def _cache_writable(cache_dir: Path) -> str | None:
    """None when `cache_dir` can hold the cache, else the reason why not."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        probe = cache_dir / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()  # the probe this pid just wrote
    except OSError as err:
        return err.strerror or str(err)
    return None


def _read_clip(path: Path, sample_rate: int) -> tuple[np.ndarray | None, str | None, bool]:
    """(int16 mono audio, None, resampled) or (None, reason, False). Never raises for bad files."""
    try:
        with sf.SoundFile(path) as f:
            rate = f.samplerate
            if f.subtype in ("FLOAT", "DOUBLE"):
                data = f.read(dtype="float32", always_2d=True)
                # NaN would be cast to an arbitrary int16 and Inf clipped to full scale: audio that is
                # not the recording, skipped here as prepare_data.py skips it
                bad = int(data.size - np.count_nonzero(np.isfinite(data)))
                if bad:
                    return None, f"{bad} NaN/Inf samples", False
                # libsndfile's float->int16 conversion does not clip: values past +-1 would wrap around
                data = np.clip(data, -1.0, 1.0) * 32767.0
            else:
                data = f.read(dtype="int16", always_2d=True)
    except Exception as err:  # soundfile raises several types for missing/corrupt files
        # the file looked for: an id given as a file name (x.wav) is looked for as wavs/x.wav.wav
        missing = f"missing file ({path.parent.name}/{path.name})"
        reason = missing if not path.exists() else f"unreadable ({str(err).splitlines()[0][:120]})"
        return None, reason, False
    if data.shape[0] == 0:
        return None, "empty audio", False
    if data.shape[1] == 1:
        mono = data[:, 0]
    else:
        mono = data.mean(axis=1, dtype=np.float32)  # downmix without int16 overflow
    resampled = rate != sample_rate
    if resampled:
        import soxr  # imported lazily: only needed for data that skipped prepare_data.py

        mono = soxr.resample(mono.astype(np.float32), rate, sample_rate)
    if mono.dtype != np.int16:
        mono = np.clip(np.rint(mono), -32768, 32767).astype(np.int16)
    if mono.shape[0] == 0:
        return None, "empty audio after resampling", False
    return np.ascontiguousarray(mono), None, resampled


def _read_all(
    paths: list[Path], sample_rate: int, threads: int, sink: Callable[[int, np.ndarray], None], progress: bool
) -> tuple[list[tuple[int, str]], int]:
    """Read clips in order with a thread pool, handing each to `sink(i, audio)` as soon as it is its turn.

    A bounded window of futures keeps memory at a few clips per thread, so the only full copy of the
    audio is the one the sink writes. Returns (failures as (position, reason), resampled count).
    """
    from tqdm.auto import tqdm

    failures: list[tuple[int, str]] = []
    resampled = 0
    # off a terminal the lines after it say how many clips were read, and in how long
    shown = progress and is_interactive()
    bar = tqdm(total=len(paths), unit="clip", desc="reading wavs", disable=not shown, mininterval=1.0)

    def handle(i: int, result: tuple[np.ndarray | None, str | None, bool]) -> None:
        nonlocal resampled
        audio, reason, was_resampled = result
        if audio is None:
            failures.append((i, reason or "unreadable"))
        else:
            resampled += was_resampled
            sink(i, audio)
        bar.update(1)

    try:
        if threads <= 1:
            for i, path in enumerate(paths):
                handle(i, _read_clip(path, sample_rate))
        else:
            window = threads * 4
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wav-read") as pool:
                pending: deque[tuple[int, Future]] = deque()
                for i, path in enumerate(paths):
                    pending.append((i, pool.submit(_read_clip, path, sample_rate)))
                    if len(pending) >= window:
                        j, fut = pending.popleft()
                        handle(j, fut.result())
                while pending:
                    j, fut = pending.popleft()
                    handle(j, fut.result())
    finally:
        bar.close()
    return failures, resampled


def _warn_if_speakers_are_sentences(meta_path: Path, rows: list[MetaRow], log: Log) -> None:
    """A metadata.csv that prepare_data.py did not write, whose third column holds sentences (LJSpeech's:
    id|text|normalised text): each one is read as a speaker name, which a warning says. Sentences are
    about one per clip and mostly hold a space; speakers are few, even named in full ("Ali Rezaei")."""
    speakers = {row.speaker for row in rows}
    many = len(speakers) > 1 and len(speakers) > len(rows) / 2
    if many and sum(" " in name for name in speakers) > len(speakers) / 2:
        log(
            f"warning: {meta_path}: its third column is read as {len(speakers)} speaker names, most of them "
            "sentences (an LJSpeech metadata.csv's normalised text?); prepare_data.py reads that format"
        )


def _ram_limit_bytes(max_ram_gb: float) -> int:
    """This process's share of the RAM limit: every process of a launch on this machine
    (LOCAL_WORLD_SIZE) preloads its own copy, so N copies must fit, not one (above its share a
    process memory-maps the cache, whose pages all processes share)."""
    local = local_processes()
    if max_ram_gb > 0:
        return int(max_ram_gb * 2**30) // local
    try:
        import psutil

        return int(psutil.virtual_memory().available * RAM_FRACTION) // local
    except Exception:  # no psutil: assume it fits
        return 2**62


def _is_cache_file_name(name: str) -> bool:
    """A name only the cache's writing gives a file: its audio, its temp files, `_cache_writable`'s probe."""
    base, _, pid = name.rpartition("-")
    return name == AUDIO_NAME or (
        pid.isdigit() and base in (f"{AUDIO_NAME}.tmp", f"{INDEX_NAME}.tmp", ".probe")
    )


def _cache_owner(cache_dir: Path) -> tuple[str, dict | None]:
    """Whose `cache_dir` is: "ours" (the tool's clip cache: its mark, or the index of a cache written
    before caches were marked, or only files of the cache's own names: such a cache's build killed
    before its index was written), "none" (no such folder, or an empty one) or "theirs" (anything else);
    and the index when it was read to tell (so `_read_index` need not read it again), else None."""
    if not cache_dir.exists():
        return "none", None
    try:
        names = {p.name for p in cache_dir.iterdir()}
        if not names:
            return "none", None
        if CACHE_MARK in names or all(_is_cache_file_name(name) for name in names):
            return "ours", None
        index = json.loads((cache_dir / INDEX_NAME).read_text(encoding="utf-8"))
        if isinstance(index, dict) and {"fingerprint", "offsets"} <= index.keys():
            return "ours", index
        return "theirs", None
    except (OSError, ValueError):  # not a folder, unreadable, no index of ours
        return "theirs", None


def _int16_bytes(wav_paths: list[Path], stats: list[tuple[int, int] | None], sample_rate: int) -> int:
    """The bytes the clips take in RAM (int16 mono at `sample_rate`), from their headers alone: a
    44.1 kHz, stereo or float wav takes several times that on disk. A header that cannot be read
    counts its file's size; a missing file nothing (it is skipped)."""
    total = 0
    for path, stat in zip(wav_paths, stats, strict=True):
        if stat is None:
            continue
        try:
            info = sf.info(str(path))
            total += math.ceil(info.frames * sample_rate / info.samplerate) * BYTES_PER_SAMPLE
        except (RuntimeError, ZeroDivisionError):  # soundfile's errors are RuntimeErrors
            total += stat[0]
    return total


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GB"


def load_clip_store(
    data_dir: Path,
    sample_rate: int,
    cache_dir: Path | None = None,
    max_ram_gb: float = 0.0,
    num_workers: int = 0,
    log: Log = print,
    progress: bool = True,
) -> tuple[ClipStore, LoadReport]:
    """Load every clip listed in `data_dir/metadata.csv` as int16 at `sample_rate`.

    Uses (or builds) the packed cache in `cache_dir` (default `data_dir/cache`). `max_ram_gb` caps
    the preloaded audio; above it the cache is memory-mapped instead (0 = 75% of available RAM).
    `num_workers` threads read the wavs when building (0 = auto). Bad clips are skipped and reported.
    """
    t0 = time.perf_counter()
    data_dir = Path(data_dir)
    meta_path, rows, report = _read_listing(data_dir, log)
    wav_paths = [_wav_path(data_dir, r.id) for r in rows]
    stats = _wav_stats(wav_paths)
    fingerprint = _fingerprint(rows, stats, sample_rate)
    report.timings["fingerprint"] = time.perf_counter() - t0

    default = cache_dir is None
    cache_dir = Path(cache_dir) if cache_dir is not None else data_dir / "cache"
    # data_dir/cache is the tool's only when it says so (its mark): a cache/ of the user's is never written
    owner, owner_index = _cache_owner(cache_dir) if default else ("ours", None)
    # the default cache goes beside the clips only in a folder this tool made (or whose cache it made)
    prepared = made_by_prepare(data_dir)
    foreign = owner == "theirs" or (owner == "none" and not prepared)
    # asked only of an index with another fingerprint: metadata.csv is read then, the wavs not again
    previous = functools.partial(_previous_fingerprint, meta_path, stats, sample_rate)
    index = None
    if not foreign:
        index = _read_index(
            cache_dir / INDEX_NAME, cache_dir / AUDIO_NAME, fingerprint, previous, owner_index, log
        )
    ram_limit = _ram_limit_bytes(max_ram_gb)
    if index is not None:
        report.cache_hit = True
        report.cache_path = str(cache_dir)
        store = _open_cache(index, rows, cache_dir / AUDIO_NAME, sample_rate, ram_limit, report, log)
    elif foreign:
        theirs = f"{cache_dir} holds files this tool did not write"
        if prepared:
            why = f"{theirs}, so no clip cache that could be memory-mapped is written there"
            fix = f"rename that folder (the clip cache is then written as {cache_dir})"
        else:
            why = "prepare_data.py did not make this folder, so no cache that could be memory-mapped is "
            why += "written into it"
            fix = f"prepare it (python prepare_data.py --source {data_dir} --data_dir DIR) and train on DIR"
        in_ram = _int16_bytes(wav_paths, stats, sample_rate)
        if in_ram > ram_limit:  # no cache to memory-map: every process would hold it all in RAM
            raise UserError(
                f"{data_dir}: its wavs ({_gb(in_ram)} as 16-bit mono at {sample_rate} Hz) exceed this "
                f"process's share of RAM ({_gb(ram_limit)}, --max_ram_gb), and {why}: {fix}"
            )
        if prepared:
            log(
                f"note: {theirs}, so it is not taken for the clip cache and is left untouched: every start "
                f"reads the wavs into RAM (to keep a cache, {fix})"
            )
        else:
            untouched = f" ({theirs}: it is left untouched)" if owner == "theirs" else ""
            log(
                f"note: {data_dir} holds no {REPORT_NAME}: prepare_data.py did not make it, so the clip "
                f"cache is not written into it{untouched} and every start reads its wavs (to keep a cache, "
                f"prepare it: python prepare_data.py --source {data_dir} --data_dir DIR, then train on DIR)"
            )
        _warn_if_speakers_are_sentences(meta_path, rows, log)
        t_build = time.perf_counter()
        store = _build_in_ram(rows, wav_paths, sample_rate, _threads(num_workers), report, log, progress)
        report.timings["build"] = time.perf_counter() - t_build
    else:
        threads = _threads(num_workers)
        store = _build_store(
            rows,
            wav_paths,
            sample_rate,
            fingerprint,
            _int16_bytes(wav_paths, stats, sample_rate),  # the cache's size, from the headers
            cache_dir,
            ram_limit,
            threads,
            report,
            log,
            progress,
        )

    report.clips = len(store)
    report.bytes = int(store.offsets[-1]) * BYTES_PER_SAMPLE
    report.hours = store.seconds / 3600
    report.in_ram = store.in_ram
    report.seconds = time.perf_counter() - t0
    if report.clips == 0:
        raise UserError(f"{meta_path}: none of the {len(rows)} listed clips could be read")
    return store, report


def _read_listing(data_dir: Path, log: Log) -> tuple[Path, list[MetaRow], LoadReport]:
    """(metadata.csv, its usable rows, a report holding its unusable lines, which are warned about)."""
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: no such data folder (run prepare_data.py first)")
    refuse_if_being_written(data_dir)  # by prepare_data.py: never cache half a corpus
    meta_path = data_dir / METADATA_NAME
    rows, problems = read_metadata(meta_path)
    report = LoadReport(metadata_problems=problems)
    if problems:
        first = "; ".join(f"line {n}: {why}" for n, why in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        log(f"warning: {meta_path}: {len(problems)} unusable line(s) ignored ({first}{more})")
    if not rows:
        raise UserError(f"{meta_path}: no usable rows")
    return meta_path, rows, report


def _build_store(
    rows: list[MetaRow],
    wav_paths: list[Path],
    sample_rate: int,
    fingerprint: str,
    cache_bytes: int,
    cache_dir: Path,
    ram_limit: int,
    threads: int,
    report: LoadReport,
    log: Log,
    progress: bool,
) -> ClipStore:
    """No usable cache: build it and open it; where no cache can be written, read every clip into RAM."""
    t_build = time.perf_counter()
    index = _try_build_cache(
        rows, wav_paths, sample_rate, fingerprint, cache_bytes, cache_dir, threads, report, log, progress
    )
    in_ram = (
        _build_in_ram(rows, wav_paths, sample_rate, threads, report, log, progress) if index is None else None
    )
    report.timings["build"] = time.perf_counter() - t_build
    if in_ram is not None:
        return in_ram
    return _open_cache(index, rows, cache_dir / AUDIO_NAME, sample_rate, ram_limit, report, log)


def _try_build_cache(
    rows: list[MetaRow],
    wav_paths: list[Path],
    sample_rate: int,
    fingerprint: str,
    cache_bytes: int,
    cache_dir: Path,
    threads: int,
    report: LoadReport,
    log: Log,
    progress: bool,
) -> dict[str, Any] | None:
    """The new cache's index, or None (after a warning saying why) when no cache could be written.
    `cache_bytes` is its audio's size (`_int16_bytes`): a 44.1 kHz, stereo or float wav takes several
    times that on disk, so the wavs' sizes would refuse a cache that fits."""
    why_not = _cache_writable(cache_dir)
    if why_not is None:
        free = shutil.disk_usage(cache_dir).free
        if free < cache_bytes * 1.05:  # and a margin for its index and a resampler's rounding
            why_not = f"only {_gb(free)} free, the cache needs about {_gb(cache_bytes)}"
    if why_not is not None:
        log(
            f"warning: cannot write the clip cache in {cache_dir} ({why_not}); loading into RAM "
            f"without a cache, so every start re-reads the wavs (to keep one, copy the data folder "
            f"somewhere writable and pass that as --data_dir)"
        )
        return None
    log(f"building clip cache in {cache_dir}: {len(rows)} clips, about {_gb(cache_bytes)} as int16")
    try:
        index = _build_cache(
            rows, wav_paths, sample_rate, fingerprint, cache_dir, threads, report, log, progress
        )
    except OSError as err:
        # reads never raise (bad clips are skipped), so this is writing: usually a full disk
        log(f"warning: writing the clip cache in {cache_dir} failed ({err}); loading into RAM instead")
        return None
    report.cache_path = str(cache_dir)
    return index


def _open_cache(
    index: dict[str, Any],
    rows: list[MetaRow],
    audio_path: Path,
    sample_rate: int,
    ram_limit: int,
    report: LoadReport,
    log: Log,
) -> ClipStore:
    """The store of a complete cache: read into RAM, or memory-mapped when it exceeds `ram_limit`.
    Texts and speakers are the listing's (`rows`), not the index's: they may have been edited since."""
    offsets = np.asarray(index["offsets"], dtype=np.int64)
    report.skipped = [(s[0], s[1]) for s in index["skipped"]]
    report.resampled = int(index["resampled"])
    if report.cache_hit and report.skipped:
        log(_skipped_line(report.skipped, " (as the clip cache recorded them; fixed wavs rebuild it)"))
    nbytes = int(offsets[-1]) * BYTES_PER_SAMPLE
    if not _holds_index(audio_path, index):  # replaced since its index was read: another run rebuilt it
        raise UserError(
            f"{audio_path} changed while this run loaded it (another run rebuilding the clip cache of the "
            "same data folder?); run again once that run has started training"
        )
    hours = int(offsets[-1]) / sample_rate / 3600
    log(f"{len(index['ids'])} clips, {hours:.2f} hours, {_gb(nbytes)} as int16")
    t_load = time.perf_counter()
    if nbytes <= ram_limit:
        audio: np.ndarray = np.fromfile(audio_path, dtype=np.int16)
    else:
        audio = np.memmap(audio_path, dtype=np.int16, mode="r", shape=(int(offsets[-1]),))
        log(
            f"audio ({_gb(nbytes)}) exceeds the RAM limit ({_gb(ram_limit)}): memory-mapping "
            f"{audio_path}; clips are read from disk on demand (the OS page cache helps after epoch 1)"
        )
    report.timings["load"] = time.perf_counter() - t_load
    listed = {r.id: r for r in rows}
    return ClipStore(
        ids=list(index["ids"]),
        texts=[listed[i].text for i in index["ids"]],
        speakers=[listed[i].speaker for i in index["ids"]],
        offsets=offsets,
        audio=audio,
        sample_rate=sample_rate,
    )


def _threads(num_workers: int) -> int:
    return num_workers if num_workers > 0 else min(MAX_READ_THREADS, os.cpu_count() or 1)


def _holds_index(audio_path: Path, index: dict[str, Any]) -> bool:
    """Whether the cache's audio file is as long as its index says (else truncated or replaced)."""
    try:
        return audio_path.stat().st_size == int(index["offsets"][-1]) * BYTES_PER_SAMPLE
    except OSError:
        return False


def _read_index(
    index_path: Path,
    audio_path: Path,
    fingerprint: str,
    previous: Callable[[], str] | None = None,
    read: dict | None = None,
    log: Log = print,
) -> dict[str, Any] | None:
    """The cache index if it is complete and matches `fingerprint` (or `previous()`, the fingerprint of
    an earlier version, asked only when the index has another one), else None (-> rebuild). `read`: the
    index as already read from `index_path` this start. A damaged cache (not an outdated one) is rebuilt
    after a note saying what is wrong with it."""
    try:
        index = read if read is not None else json.loads(index_path.read_text(encoding="utf-8"))
    except OSError:
        return None  # no index: a build killed before writing it, or a cache never built
    except ValueError as err:  # UnicodeDecodeError included
        index, damage = None, f"not valid JSON: {str(err).splitlines()[0][:80]}"
    else:
        damage = None if isinstance(index, dict) else f"holds a JSON {type(index).__name__}, not an object"
    if damage is None:
        if index.get("version") != CACHE_VERSION:
            return None
        if index.get("fingerprint") != fingerprint and (
            previous is None or index.get("fingerprint") != previous()
        ):
            return None
        damage = _index_damage(index, audio_path)
        if damage is None:
            return index
    log(f"note: the clip cache {index_path} is damaged ({damage}); rebuilding it")
    return None


def _index_damage(index: dict[str, Any], audio_path: Path) -> str | None:
    """What makes an index of this cache's fingerprint unusable (hand-edited, or a disk's damage), else
    None: each field `_open_cache` reads must be there and agree with the others and with the audio file."""
    ids, offsets, skipped = index.get("ids"), index.get("offsets"), index.get("skipped")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return "its ids are not a list of names"
    if not isinstance(offsets, list) or not all(type(o) is int for o in offsets):
        return "its offsets are not a list of whole numbers"
    if len(offsets) != len(ids) + 1 or offsets[0] != 0 or any(b < a for a, b in itertools.pairwise(offsets)):
        return f"its {len(offsets)} offsets do not bound its {len(ids)} clips"
    if not isinstance(skipped, list) or not all(isinstance(s, list) and len(s) == 2 for s in skipped):
        return "its list of skipped clips is missing or malformed"
    if type(index.get("resampled")) is not int:
        return "its count of resampled clips is missing"
    if not _holds_index(audio_path, index):
        try:
            size = f"is {audio_path.stat().st_size} bytes"
        except OSError:
            size = "cannot be read"
        return f"{audio_path.name} {size}, its index needs {offsets[-1] * BYTES_PER_SAMPLE}"
    return None


def _log_build_summary(report: LoadReport, sample_rate: int, log: Log) -> None:
    if report.resampled:
        log(
            f"warning: {report.resampled} clip(s) were not at {sample_rate} Hz and were resampled while "
            f"loading; run prepare_data.py to convert them once instead"
        )
    if report.skipped:
        log(_skipped_line(report.skipped))


def _skipped_line(skipped: list[tuple[str, str]], note: str = "") -> str:
    """The one warning for clips that could not be read: how many, the first three and why."""
    first = "; ".join(f"{i}: {why}" for i, why in skipped[:3])
    more = f"; {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return f"warning: {len(skipped)} clip(s) could not be read and are skipped ({first}{more}){note}"


def _build_cache(
    rows: list[MetaRow],
    wav_paths: list[Path],
    sample_rate: int,
    fingerprint: str,
    cache_dir: Path,
    threads: int,
    report: LoadReport,
    log: Log,
    progress: bool,
) -> dict[str, Any]:
    """Stream every clip into `audio_int16.bin`, then write `index.json` last, both atomically."""
    audio_path, index_path = cache_dir / AUDIO_NAME, cache_dir / INDEX_NAME
    suffix = f".tmp-{os.getpid()}"
    tmp_audio = audio_path.with_name(AUDIO_NAME + suffix)
    tmp_index = index_path.with_name(INDEX_NAME + suffix)
    kept: list[int] = []
    offsets = [0]
    (cache_dir / CACHE_MARK).write_text(f"vits_trainer clip cache v{CACHE_VERSION}\n", encoding="utf-8")
    try:
        with open(tmp_audio, "wb") as f:

            def sink(i: int, audio: np.ndarray) -> None:
                f.write(memoryview(audio).cast("B"))
                kept.append(i)
                offsets.append(offsets[-1] + len(audio))

            failures, report.resampled = _read_all(wav_paths, sample_rate, threads, sink, progress)
            f.flush()
            os.fsync(f.fileno())
        report.skipped = [(rows[i].id, why) for i, why in failures]
        index = {
            "version": CACHE_VERSION,
            "fingerprint": fingerprint,
            "sample_rate": sample_rate,
            "ids": [rows[i].id for i in kept],
            "texts": [rows[i].text for i in kept],
            "speakers": [rows[i].speaker for i in kept],
            "offsets": offsets,
            "skipped": [list(s) for s in report.skipped],
            "resampled": report.resampled,
        }
        # Drop the old index first: an old index next to a new bin must never look valid.
        # (cache/ files have fixed names of this tool; no run writes its outputs into cache/: safety.py)
        index_path.unlink(missing_ok=True)
        os.replace(tmp_audio, audio_path)
        with open(tmp_index, "w", encoding="utf-8") as f:
            json.dump(index, f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_index, index_path)
    finally:  # our pid's temp files
        tmp_audio.unlink(missing_ok=True)
        tmp_index.unlink(missing_ok=True)
    _log_build_summary(report, sample_rate, log)
    return index


def _build_in_ram(
    rows: list[MetaRow],
    wav_paths: list[Path],
    sample_rate: int,
    threads: int,
    report: LoadReport,
    log: Log,
    progress: bool,
) -> ClipStore:
    """No cache possible: read every clip into one array (peak RAM stays close to one copy)."""
    pieces: dict[int, np.ndarray] = {}
    failures, report.resampled = _read_all(
        wav_paths, sample_rate, threads, lambda i, a: pieces.__setitem__(i, a), progress
    )
    report.skipped = [(rows[i].id, why) for i, why in failures]
    kept = sorted(pieces)
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum([len(pieces[i]) for i in kept], out=offsets[1:])
    # np.empty pages are committed only when written, and each piece is freed right after its copy,
    # so this never holds two full copies.
    audio = np.empty(int(offsets[-1]), dtype=np.int16)
    for n, i in enumerate(kept):
        audio[offsets[n] : offsets[n + 1]] = pieces.pop(i)
    _log_build_summary(report, sample_rate, log)
    log(f"{len(kept)} clips, {offsets[-1] / sample_rate / 3600:.2f} hours, {_gb(audio.nbytes)} as int16")
    return ClipStore(
        ids=[rows[i].id for i in kept],
        texts=[rows[i].text for i in kept],
        speakers=[rows[i].speaker for i in kept],
        offsets=offsets,
        audio=audio,
        sample_rate=sample_rate,
    )
