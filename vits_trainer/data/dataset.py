"""The training data pipeline: every clip preloaded as int16, length-bucketed batches, cheap collation.

Reading WAVs from disk per sample starved the GPU (1.7 samples/s), so all clips are loaded once at
start into one int16 array (half the RAM of float32) with offsets. The array is built once into a
packed cache (`audio_int16.bin` + `index.json`) so the next start is a single sequential read, or a
memory map when the set does not fit in RAM. Spectrograms are not computed here: the trainer makes
them on the device per batch from the float audio that `collate_batch` produces.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import UserError
from .metadata import METADATA_NAME, WAVS_DIR, MetaRow, read_metadata

CACHE_VERSION = 1  # bump when the cache layout or the decoding changes: old caches then rebuild
AUDIO_NAME = "audio_int16.bin"
INDEX_NAME = "index.json"
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


def _fingerprint(metadata_bytes: bytes, wav_paths: list[Path], sample_rate: int) -> tuple[str, int]:
    """Hash of everything the cache depends on; also returns the total wav bytes (a size estimate).

    (size, mtime_ns) per wav instead of content hashes: stat is ~1000x cheaper than reading, and a
    rewritten file changes its mtime.
    """
    h = hashlib.sha256()
    h.update(f"vits-trainer clip cache v{CACHE_VERSION} sr={sample_rate}\n".encode())
    h.update(hashlib.sha256(metadata_bytes).digest())
    total = 0
    for path in wav_paths:
        try:
            st = os.stat(path)
            h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
            total += st.st_size
        except OSError:
            h.update(b"missing\n")
    return h.hexdigest(), total


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
                # libsndfile's float->int16 conversion does not clip: values past +-1 would wrap around
                data = np.clip(f.read(dtype="float32", always_2d=True), -1.0, 1.0) * 32767.0
            else:
                data = f.read(dtype="int16", always_2d=True)
    except Exception as err:  # soundfile raises several types for missing/corrupt files
        reason = "missing file" if not path.exists() else f"unreadable ({str(err).splitlines()[0][:120]})"
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
    bar = tqdm(total=len(paths), unit="clip", desc="reading wavs", disable=not progress, mininterval=1.0)

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


def _ram_limit_bytes(max_ram_gb: float) -> int:
    if max_ram_gb > 0:
        return int(max_ram_gb * 2**30)
    try:
        import psutil

        return int(psutil.virtual_memory().available * RAM_FRACTION)
    except Exception:  # no psutil: assume it fits
        return 2**62


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
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: no such data folder (run prepare_data.py first)")
    meta_path = data_dir / METADATA_NAME
    rows, problems = read_metadata(meta_path)
    report = LoadReport(metadata_problems=problems)
    if problems:
        first = "; ".join(f"line {n}: {why}" for n, why in problems[:3])
        log(f"warning: {meta_path}: {len(problems)} unusable line(s) ignored ({first})")
    if not rows:
        raise UserError(f"{meta_path}: no usable rows")

    wav_paths = [_wav_path(data_dir, r.id) for r in rows]
    metadata_bytes = meta_path.read_bytes()
    fingerprint, wav_bytes = _fingerprint(metadata_bytes, wav_paths, sample_rate)
    report.timings["fingerprint"] = time.perf_counter() - t0

    cache_dir = Path(cache_dir) if cache_dir is not None else data_dir / "cache"
    audio_path, index_path = cache_dir / AUDIO_NAME, cache_dir / INDEX_NAME
    index = _read_index(index_path, audio_path, fingerprint)
    ram_limit = _ram_limit_bytes(max_ram_gb)

    if index is not None:
        report.cache_hit = True
        report.cache_path = str(cache_dir)
    else:
        t_build = time.perf_counter()
        why_not = _cache_writable(cache_dir)
        if why_not is None:
            free = shutil.disk_usage(cache_dir).free
            if free < wav_bytes * 1.05:  # int16 mono at the target rate is at most the wav bytes, roughly
                why_not = f"only {_gb(free)} free, the cache needs about {_gb(wav_bytes)}"
        if why_not is not None:
            log(
                f"warning: cannot write the clip cache in {cache_dir} ({why_not}); loading into RAM "
                f"without a cache, so every start re-reads the wavs (pass a writable cache dir)"
            )
            store = _build_in_ram(rows, wav_paths, sample_rate, _threads(num_workers), report, log, progress)
        else:
            log(f"building clip cache in {cache_dir}: {len(rows)} clips, {_gb(wav_bytes)} of wav files")
            threads = _threads(num_workers)
            try:
                index = _build_cache(
                    rows, wav_paths, sample_rate, fingerprint, cache_dir, threads, report, log, progress
                )
                report.cache_path = str(cache_dir)
            except OSError as err:
                # reads never raise (bad clips are skipped), so this is writing: usually a full disk
                log(
                    f"warning: writing the clip cache in {cache_dir} failed ({err}); loading into RAM instead"
                )
                store = _build_in_ram(rows, wav_paths, sample_rate, threads, report, log, progress)
        report.timings["build"] = time.perf_counter() - t_build

    if index is not None:
        offsets = np.asarray(index["offsets"], dtype=np.int64)
        report.skipped = [(s[0], s[1]) for s in index["skipped"]]
        report.resampled = int(index["resampled"])
        if report.cache_hit and report.skipped:
            log(f"warning: {len(report.skipped)} clip(s) skipped (cached result; fix the wavs to rebuild)")
        nbytes = int(offsets[-1]) * BYTES_PER_SAMPLE
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
        store = ClipStore(
            ids=list(index["ids"]),
            texts=list(index["texts"]),
            speakers=list(index["speakers"]),
            offsets=offsets,
            audio=audio,
            sample_rate=sample_rate,
        )

    report.clips = len(store)
    report.bytes = int(store.offsets[-1]) * BYTES_PER_SAMPLE
    report.hours = store.seconds / 3600
    report.in_ram = store.in_ram
    report.seconds = time.perf_counter() - t0
    if report.clips == 0:
        raise UserError(f"{meta_path}: none of the {len(rows)} listed clips could be read")
    return store, report


def _threads(num_workers: int) -> int:
    return num_workers if num_workers > 0 else min(MAX_READ_THREADS, os.cpu_count() or 1)


def _read_index(index_path: Path, audio_path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The cache index if it is complete and matches `fingerprint`, else None (-> rebuild)."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        if index.get("version") != CACHE_VERSION or index.get("fingerprint") != fingerprint:
            return None
        if audio_path.stat().st_size != int(index["offsets"][-1]) * BYTES_PER_SAMPLE:
            return None  # truncated or replaced by hand
        return index
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _log_build_summary(report: LoadReport, sample_rate: int, log: Log) -> None:
    if report.resampled:
        log(
            f"warning: {report.resampled} clip(s) were not at {sample_rate} Hz and were resampled while "
            f"loading; run prepare_data.py to convert them once instead"
        )
    if report.skipped:
        first = "; ".join(f"{i}: {why}" for i, why in report.skipped[:3])
        log(f"warning: {len(report.skipped)} clip(s) skipped ({first})")


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


# ---------------------------------------------------------------------------------------------------
# Speakers, tokens, validation split


def speaker_map(speakers: Sequence[str], num_speakers: int, log: Log = print) -> dict[str, int]:
    """Map speaker names to embedding ids of a model with `num_speakers` speakers.

    Single-speaker models: everyone is 0. Multi-speaker: a name that is a canonical integer below
    `num_speakers` keeps that id (data prepared with the checkpoint's own speaker ids), the other
    names take the free ids in sorted order.
    """
    names = sorted(set(speakers))
    if num_speakers <= 1:
        if len(names) > 1:
            log(
                f"warning: the data has {len(names)} speakers but the model has a single voice; "
                f"all clips train that one voice (--num_speakers auto gives each speaker its own)"
            )
        return dict.fromkeys(names, 0)
    if len(names) > num_speakers:
        raise UserError(
            f"the data has {len(names)} distinct speakers but the model has only {num_speakers} "
            f"speaker embeddings; merge speakers in metadata.csv or use a model with more speakers"
        )
    mapping: dict[str, int] = {}
    for name in names:
        if name.isascii() and name.isdigit() and str(int(name)) == name and int(name) < num_speakers:
            mapping[name] = int(name)
    free = iter(sorted(set(range(num_speakers)) - set(mapping.values())))
    for name in names:
        if name not in mapping:
            mapping[name] = next(free)
    return mapping


@dataclass
class TrainingItems:
    """What the trainer iterates over: a subset of the store, tokenized."""

    store: ClipStore
    indices: np.ndarray  # int64 store indices
    token_ids: list[np.ndarray]  # int64 per item
    speaker_ids: np.ndarray  # int64 per item

    def __len__(self) -> int:
        return len(self.indices)

    def audio_lengths(self) -> np.ndarray:
        """Samples per item: the sort key for bucketing (audio dominates padding and memory)."""
        return self.store.lengths()[self.indices] if len(self.indices) else np.zeros(0, np.int64)

    def ids(self) -> list[str]:
        return [self.store.ids[int(i)] for i in self.indices]

    # per-item access by position, the interface the DataLoader and the trainer use
    def audio(self, i: int) -> np.ndarray:
        return self.store.clip(int(self.indices[i]))

    def clip_id(self, i: int) -> str:
        return self.store.ids[int(self.indices[i])]

    def text(self, i: int) -> str:
        return self.store.texts[int(self.indices[i])]

    @property
    def sample_rate(self) -> int:
        return self.store.sample_rate


def build_items(
    store: ClipStore,
    indices: Sequence[int] | np.ndarray,
    tokenize: Callable[[str], list[int]],
    speaker_to_id: dict[str, int],
    hop_length: int,
    log: Log = print,
) -> tuple[TrainingItems, list[tuple[str, str]]]:
    """Tokenize the clips at `indices`; drop (and return as (id, reason)) the ones VITS cannot align.

    The monotonic alignment search needs at least one spectrogram frame per token, so a clip with
    more tokens than `samples // hop_length` frames (or no tokens at all) is unusable.
    """
    kept: list[int] = []
    tokens: list[np.ndarray] = []
    speaker_ids: list[int] = []
    dropped: list[tuple[str, str]] = []
    for idx in (int(i) for i in indices):
        clip_id = store.ids[idx]
        ids = np.asarray(tokenize(store.texts[idx]), dtype=np.int64)
        frames = store.num_samples(idx) // hop_length
        speaker = store.speakers[idx]
        if len(ids) == 0:
            dropped.append((clip_id, "no tokens (no character of the text is in the model's vocabulary)"))
        elif len(ids) > frames:
            dropped.append((clip_id, f"{len(ids)} tokens but only {frames} frames of audio (clip too short)"))
        elif speaker not in speaker_to_id:
            dropped.append((clip_id, f"unknown speaker {speaker!r}"))
        else:
            kept.append(idx)
            tokens.append(ids)
            speaker_ids.append(speaker_to_id[speaker])
    if dropped:
        first = "; ".join(f"{i}: {why}" for i, why in dropped[:3])
        log(f"warning: {len(dropped)} of {len(dropped) + len(kept)} clip(s) dropped ({first})")
    items = TrainingItems(
        store=store,
        indices=np.asarray(kept, dtype=np.int64),
        token_ids=tokens,
        speaker_ids=np.asarray(speaker_ids, dtype=np.int64),
    )
    return items, dropped


def split_train_val(
    ids: Sequence[str], val_fraction: float, min_val: int = 4, max_val: int | None = None, seed: int = 0
) -> tuple[list[int], list[int]]:
    """(train positions, val positions) into `ids`, both ascending.

    Chosen by a hash of (seed, id) rather than row order, so every resume and every rank picks the
    same validation clips even if metadata.csv was reordered or extended.
    """
    n = len(ids)
    if n < 2:
        raise UserError(f"need at least 2 usable clips to hold one out for validation, got {n}")
    k = max(min_val, round(val_fraction * n))
    if max_val is not None:
        k = min(k, max_val)
    k = max(0, min(k, n - 1))  # never leave training empty
    keys = [hashlib.blake2b(f"{seed}\0{clip_id}".encode(), digest_size=8).digest() for clip_id in ids]
    order = sorted(range(n), key=lambda i: (keys[i], ids[i]))
    val = sorted(order[:k])
    val_set = set(val)
    return [i for i in range(n) if i not in val_set], val


# ---------------------------------------------------------------------------------------------------
# Batching


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length in random order, sharded across ranks.

    Shuffled: a seeded permutation is cut into pools of `batch_size * bucket_size_multiplier`, each
    pool sorted by length and cut into batches, then the batch order is shuffled: padding stays
    small but the order stays random. Unshuffled (validation): sorted by length, deterministic.
    Every rank gets the same number of batches (a few repeated to pad), disjoint otherwise.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size_multiplier: int = 20,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in [0, {num_replicas})")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.bucket_size_multiplier = max(1, bucket_size_multiplier)
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start(self, batch_index: int) -> None:
        """Resume mid-epoch: the next iteration skips its first `batch_index` batches (once)."""
        self._start = max(0, int(batch_index))

    def _all_batches(self) -> list[np.ndarray]:
        n = len(self.lengths)
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")
            batches = [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        else:
            rng = np.random.default_rng([self.seed, self.epoch])
            perm = rng.permutation(n)
            pool = self.batch_size * self.bucket_size_multiplier
            batches = []
            for start in range(0, n, pool):
                chunk = perm[start : start + pool]
                # stable sort of a random permutation: equal lengths stay in random order
                chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
                batches.extend(chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        return batches

    def _rank_count(self, total: int) -> int:
        if self.drop_last:
            return total // self.num_replicas
        return math.ceil(total / self.num_replicas)

    def _rank_batches(self) -> list[np.ndarray]:
        batches = self._all_batches()
        per_rank = self._rank_count(len(batches))
        needed = per_rank * self.num_replicas
        if needed > len(batches) and batches:
            batches = batches + [batches[i % len(batches)] for i in range(needed - len(batches))]
        return batches[:needed][self.rank :: self.num_replicas]

    def __len__(self) -> int:
        # pools are whole multiples of batch_size, so at most one batch per epoch is short
        n = len(self.lengths)
        total = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return self._rank_count(total)

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        for batch in self._rank_batches()[start:]:
            yield batch.tolist()


# ---------------------------------------------------------------------------------------------------
# Dataset, collation, loader


class ClipDataset(Dataset):
    """Items as small dicts of numpy views; works in forked and spawned DataLoader workers."""

    def __init__(self, items: TrainingItems) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "token_ids": self.items.token_ids[i],
            "audio": self.items.audio(i),
            "speaker_id": int(self.items.speaker_ids[i]),
            "index": i,  # position in the items (items.clip_id(i) names the clip in logs)
        }


_INT16_SCALE = np.float32(1.0 / 32768.0)


def collate_batch(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad into preallocated numpy arrays and wrap them as tensors (no extra copy), audio as float32."""
    b = len(items)
    text_lengths = np.fromiter((len(it["token_ids"]) for it in items), dtype=np.int64, count=b)
    audio_lengths = np.fromiter((len(it["audio"]) for it in items), dtype=np.int64, count=b)
    t_max = int(text_lengths.max()) if b else 0
    s_max = int(audio_lengths.max()) if b else 0
    input_ids = np.zeros((b, t_max), dtype=np.int64)
    attention_mask = np.zeros((b, t_max), dtype=np.int64)
    audio = np.zeros((b, 1, s_max), dtype=np.float32)
    for j, it in enumerate(items):
        t, s = text_lengths[j], audio_lengths[j]
        input_ids[j, :t] = it["token_ids"]
        attention_mask[j, :t] = 1
        np.multiply(it["audio"], _INT16_SCALE, out=audio[j, 0, :s])
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
        "text_lengths": torch.from_numpy(text_lengths),
        "audio": torch.from_numpy(audio),
        "audio_lengths": torch.from_numpy(audio_lengths),
        "speaker_ids": torch.tensor([it["speaker_id"] for it in items], dtype=torch.int64),
        "indices": torch.tensor([it["index"] for it in items], dtype=torch.int64),
    }


def make_loader(
    items: TrainingItems, batch_sampler: BucketBatchSampler, num_workers: int, pin_memory: bool
) -> DataLoader:
    """A DataLoader over `items`; workers stay alive across epochs (the sampler lives in this process)."""
    extra: dict[str, Any] = {}
    if num_workers > 0:
        # a few batches ahead per worker hides collation; more only costs pinned RAM
        extra = {"persistent_workers": True, "prefetch_factor": 4}
        if sys.platform == "linux":
            # fork shares the preloaded audio copy-on-write; spawn/forkserver (Python 3.14's default)
            # would pickle a full copy of it into every worker
            extra["multiprocessing_context"] = "fork"
    return DataLoader(
        ClipDataset(items),
        batch_sampler=batch_sampler,
        collate_fn=collate_batch,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **extra,
    )


# ---------------------------------------------------------------------------------------------------
# Several item sets as one, and a sampler that mixes a fixed set with a fresh replay draw per epoch


class CombinedItems:
    """Several `TrainingItems` (possibly of different stores) concatenated, with the same per-position
    interface: position `i` of the whole maps to one part. The trainer and `ClipDataset` only use it."""

    def __init__(self, parts: Sequence[TrainingItems | CombinedItems]) -> None:
        if not parts:
            raise ValueError("CombinedItems needs at least one part")
        rates = {p.sample_rate for p in parts}
        if len(rates) > 1:
            raise ValueError(f"parts have different sample rates: {sorted(rates)}")
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
        # flat lists/arrays so the DataLoader's per-item access stays a plain index
        self.token_ids: list[np.ndarray] = [t for p in parts for t in p.token_ids]
        self.speaker_ids = (
            np.concatenate([np.asarray(p.speaker_ids, dtype=np.int64) for p in parts])
            if len(self)
            else np.zeros(0, np.int64)
        )

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _locate(self, i: int) -> tuple[TrainingItems | CombinedItems, int]:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"position {i} out of range for {len(self)} items")
        part = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[part], i - int(self.offsets[part])

    def part_range(self, part: int) -> range:
        """The positions of part `part` in the whole."""
        return range(int(self.offsets[part]), int(self.offsets[part + 1]))

    def audio_lengths(self) -> np.ndarray:
        return np.concatenate([p.audio_lengths() for p in self.parts]).astype(np.int64)

    def ids(self) -> list[str]:
        return [clip_id for p in self.parts for clip_id in p.ids()]

    def audio(self, i: int) -> np.ndarray:
        part, j = self._locate(i)
        return part.audio(j)

    def clip_id(self, i: int) -> str:
        part, j = self._locate(i)
        return part.clip_id(j)

    def text(self, i: int) -> str:
        part, j = self._locate(i)
        return part.text(j)

    @property
    def sample_rate(self) -> int:
        return self.parts[0].sample_rate


class ReplayBatchSampler(Sampler[list[int]]):
    """Each epoch: every position in `fixed` plus `replay_count` positions drawn from `replay_pool`,
    bucketed and sharded exactly as `BucketBatchSampler` does (same set_epoch/set_start/__len__).

    The replay draw is fresh every epoch, seeded by (seed, epoch) so every rank and every resume draws
    the same clips; without replacement while the pool lasts (whole permutations of the pool are
    chained when more clips are asked for than it holds).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        fixed: Sequence[int],
        replay_pool: Sequence[int],
        replay_count: int,
        batch_size: int,
        seed: int = 0,
        bucket_size_multiplier: int = 20,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if replay_count < 0:
            raise ValueError(f"replay_count must be >= 0, got {replay_count}")
        if replay_count > 0 and len(replay_pool) == 0:
            raise ValueError("replay_count > 0 but the replay pool is empty")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.fixed = np.asarray(fixed, dtype=np.int64)
        self.replay_pool = np.asarray(replay_pool, dtype=np.int64)
        self.replay_count = int(replay_count)
        self.seed = seed
        self.epoch = 0
        self._start = 0
        # a template for the counting and sharding rules: the per-epoch sampler has the same size
        self._template = BucketBatchSampler(
            np.zeros(self.epoch_size, dtype=np.int64),
            batch_size,
            shuffle=True,
            seed=seed,
            bucket_size_multiplier=bucket_size_multiplier,
            drop_last=drop_last,
            num_replicas=num_replicas,
            rank=rank,
        )

    @property
    def epoch_size(self) -> int:
        """Items one epoch holds across all ranks (before padding to equal rank shares)."""
        return len(self.fixed) + self.replay_count

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start(self, batch_index: int) -> None:
        """Resume mid-epoch: the next iteration skips its first `batch_index` batches (once)."""
        self._start = max(0, int(batch_index))

    def replay_draw(self, epoch: int) -> np.ndarray:
        """The replay positions of `epoch` (the same on every rank and every resume)."""
        if self.replay_count == 0:
            return np.zeros(0, dtype=np.int64)
        # a separate stream from the bucketing's [seed, epoch] one, so the draw does not shape the order
        rng = np.random.default_rng([self.seed, epoch, 1])
        rounds = math.ceil(self.replay_count / len(self.replay_pool))
        order = np.concatenate([rng.permutation(self.replay_pool) for _ in range(rounds)])
        return order[: self.replay_count]

    def epoch_items(self, epoch: int) -> np.ndarray:
        """All positions of `epoch`: the fixed ones, then that epoch's replay draw."""
        return np.concatenate([self.fixed, self.replay_draw(epoch)])

    def _epoch_sampler(self) -> tuple[BucketBatchSampler, np.ndarray]:
        items = self.epoch_items(self.epoch)
        inner = copy.copy(self._template)  # the same settings, this epoch's clips
        inner.lengths = self.lengths[items]
        inner.set_epoch(self.epoch)
        return inner, items

    def __len__(self) -> int:
        return len(self._template)

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        inner, items = self._epoch_sampler()
        for batch in inner._rank_batches()[start:]:
            yield items[batch].tolist()
