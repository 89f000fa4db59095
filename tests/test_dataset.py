"""The data pipeline: clip cache, item filtering, validation split, bucketed batching, collation."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from vits_trainer.data.clipstore import AUDIO_NAME, INDEX_NAME, ClipStore, load_clip_store
from vits_trainer.data.items import build_items, speaker_map, split_train_val
from vits_trainer.data.loader import ClipDataset, collate_batch, make_loader
from vits_trainer.data.sampler import BucketBatchSampler, ReplayBatchSampler
from vits_trainer.data.synthetic import ALPHABET, make_corpus
from vits_trainer.errors import UserError

SR = 16000


def quiet(_msg: str) -> None:
    pass


class Logs(list):
    def __call__(self, msg: str) -> None:
        self.append(msg)


def load(data_dir: Path, **kw):
    kw.setdefault("log", quiet)
    kw.setdefault("progress", False)
    return load_clip_store(data_dir, SR, **kw)


def char_tokenize(text: str) -> list[int]:
    return [ALPHABET.index(c) + 1 if c in ALPHABET else 0 for c in text]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    make_corpus(tmp_path / "data", num_clips=24, sample_rate=SR, num_speakers=2, seed=3)
    return tmp_path / "data"


def assert_same_store(a: ClipStore, b: ClipStore) -> None:
    assert a.ids == b.ids and a.texts == b.texts and a.speakers == b.speakers
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(np.asarray(a.audio), np.asarray(b.audio))


# --- clip store and cache -------------------------------------------------------------------------


def test_cache_build_then_hit(corpus: Path) -> None:
    t0 = time.perf_counter()
    store, report = load(corpus)
    cold = time.perf_counter() - t0
    assert not report.cache_hit and report.in_ram and report.clips == 24 and not report.skipped
    assert (corpus / "cache" / AUDIO_NAME).is_file() and (corpus / "cache" / INDEX_NAME).is_file()
    assert store.audio.dtype == np.int16 and store.offsets.dtype == np.int64
    assert report.bytes == store.audio.nbytes and report.hours == pytest.approx(store.seconds / 3600)

    # the clips are exactly the 16-bit samples in the wavs
    for i in (0, 11, 23):
        wav, rate = sf.read(corpus / "wavs" / f"{store.ids[i]}.wav", dtype="int16")
        assert rate == SR
        np.testing.assert_array_equal(store.clip(i), wav)
        assert store.num_samples(i) == len(wav)

    t0 = time.perf_counter()
    again, report2 = load(corpus)
    warm = time.perf_counter() - t0
    assert report2.cache_hit and report2.clips == 24
    assert_same_store(store, again)
    assert warm < cold
    assert report2.to_dict()["cache_hit"] is True


def test_cache_invalidated_by_metadata_and_wav_changes(corpus: Path) -> None:
    store, _ = load(corpus)
    meta = corpus / "metadata.csv"
    lines = meta.read_text().splitlines()
    meta.write_text("\n".join(lines[:-1]) + "\n")  # drop the last clip
    store2, report = load(corpus)
    assert not report.cache_hit and len(store2) == 23

    _, report = load(corpus)
    assert report.cache_hit

    # rewrite one wav with different audio (the new mtime alone is what invalidates)
    target = corpus / "wavs" / f"{store.ids[0]}.wav"
    sf.write(target, np.zeros(SR // 2, dtype=np.int16), SR, subtype="PCM_16")
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    store3, report = load(corpus)
    assert not report.cache_hit
    assert store3.num_samples(0) == SR // 2 and not store3.clip(0).any()

    # a different target sample rate is a different cache
    _, report = load_clip_store(corpus, 8000, log=quiet, progress=False)
    assert not report.cache_hit and report.resampled == 23


def test_an_edited_transcript_keeps_the_cache_and_is_read_afresh(corpus: Path) -> None:
    store, _ = load(corpus)
    meta = corpus / "metadata.csv"
    lines = meta.read_text().splitlines()
    clip_id, _, _ = lines[3].split("|")
    lines[3] = f"{clip_id}|edited text|someone"
    meta.write_text("\n".join(lines) + "\n")
    again, report = load(corpus)
    assert report.cache_hit  # the audio is the same: no wav is read again
    assert (again.texts[3], again.speakers[3]) == ("edited text", "someone")
    np.testing.assert_array_equal(np.asarray(again.audio), np.asarray(store.audio))
    meta.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # another order: rebuilt
    reordered, report = load(corpus)
    assert not report.cache_hit and reordered.ids[:2] == [store.ids[1], store.ids[0]]


def test_clips_that_swap_places_keep_their_own_audio_even_with_equal_file_stats(corpus: Path) -> None:
    # Wavs unpacked from an archive share their mtime, and clips of fixed length their size: the cache is
    # told apart by the clips' ids too, or reordered rows would get each other's audio.
    lines = (corpus / "metadata.csv").read_text().splitlines()
    first, second = (line.split("|")[0] for line in lines[:2])
    for k, clip_id in enumerate((first, second)):
        sf.write(corpus / "wavs" / f"{clip_id}.wav", np.full(SR // 4, 1000 * (k + 1), np.int16), SR)
        os.utime(corpus / "wavs" / f"{clip_id}.wav", ns=(10**18, 10**18))
    store, _ = load(corpus)
    assert store.ids[:2] == [first, second] and store.clip(0)[0] == 1000 and store.clip(1)[0] == 2000
    (corpus / "metadata.csv").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    swapped, _ = load(corpus)
    assert swapped.ids[:2] == [second, first]
    assert swapped.clip(0)[0] == 2000 and swapped.clip(1)[0] == 1000


def test_a_cache_of_the_previous_fingerprint_is_still_used_on_a_read_only_folder(
    corpus: Path, monkeypatch
) -> None:
    """Caches written before the fingerprint named the clip ids hashed metadata.csv's bytes. A data folder
    attached read-only (a dataset uploaded with its cache) cannot rebuild its cache: after the change every
    start read every wav again, into RAM whatever --max_ram_gb said."""
    import hashlib
    import json

    from vits_trainer.data import clipstore

    store, _ = load(corpus)
    index_path = corpus / "cache" / INDEX_NAME
    index = json.loads(index_path.read_text(encoding="utf-8"))
    meta = corpus / "metadata.csv"
    h = hashlib.sha256()  # the earlier version's fingerprint, as it wrote it
    h.update(f"vits-trainer clip cache v{index['version']} sr={SR}\n".encode())
    h.update(hashlib.sha256(meta.read_bytes()).digest())
    for clip_id in [line.split("|")[0] for line in meta.read_text().splitlines()]:
        st = os.stat(corpus / "wavs" / f"{clip_id}.wav")
        h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
    index["fingerprint"] = h.hexdigest()
    index_path.write_text(json.dumps(index), encoding="utf-8")
    monkeypatch.setattr(clipstore, "_cache_writable", lambda cache_dir: "Read-only file system")
    again, report = load(corpus)
    assert report.cache_hit
    np.testing.assert_array_equal(np.asarray(again.audio), np.asarray(store.audio))
    meta.write_text(meta.read_text().replace("|", "| ", 1))  # another listing: that cache no longer holds
    _, report = load(corpus)
    assert not report.cache_hit


def test_an_unmarked_older_caches_index_is_read_once_per_start(corpus: Path, monkeypatch) -> None:
    """A cache written before caches were marked is told ours by its index, which was then read again."""
    from vits_trainer.data.clipstore import CACHE_MARK

    load(corpus)
    (corpus / "cache" / CACHE_MARK).unlink()  # as a cache of an earlier version has no mark
    reads: list[Path] = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == INDEX_NAME:
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    _, report = load(corpus)
    assert report.cache_hit
    assert reads == [corpus / "cache" / INDEX_NAME]


def test_half_written_cache_is_never_used(corpus: Path) -> None:
    store, _ = load(corpus)
    bin_path = corpus / "cache" / AUDIO_NAME
    with open(bin_path, "r+b") as f:
        f.truncate(bin_path.stat().st_size // 2)
    lines = Logs()
    again, report = load(corpus, log=lines)
    assert not report.cache_hit
    assert_same_store(store, again)
    assert any(line.startswith("note:") and "damaged" in line and AUDIO_NAME in line for line in lines), lines


def _set(field: str, value):
    def damage(index: dict) -> str:
        index[field] = value
        return json.dumps(index)

    return damage


def _without(field: str):
    return lambda index: json.dumps({k: v for k, v in index.items() if k != field})


def _swap_offsets(index: dict) -> str:
    index["offsets"][1], index["offsets"][2] = index["offsets"][2], index["offsets"][1]
    return json.dumps(index)


INDEX_DAMAGE = {
    "a list": lambda index: "[]",
    "a number": lambda index: "3",
    "a string": lambda index: '"x"',
    "null": lambda index: "null",
    "empty": lambda index: "",
    "cut short": lambda index: json.dumps(index)[:50],
    "no skipped": _without("skipped"),
    "no resampled": _without("resampled"),
    "ids not a list": _set("ids", 7),
    "two offsets": lambda index: _set("offsets", [0, index["offsets"][-1]])(index),
    "falling offsets": _swap_offsets,
    "offsets past the audio": lambda index: _set("offsets", [o * 2 for o in index["offsets"]])(index),
}


@pytest.mark.parametrize("damage", INDEX_DAMAGE, ids=list(INDEX_DAMAGE))
def test_a_damaged_index_of_the_tools_own_cache_is_rebuilt_with_a_note(corpus: Path, damage: str) -> None:
    # index.json valid JSON but no object crashed the start (AttributeError on .get); an object missing a
    # field raised a KeyError, and offsets that no longer match the ids were taken for a cache hit
    store, _ = load(corpus)
    index_path = corpus / "cache" / INDEX_NAME
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index_path.write_text(INDEX_DAMAGE[damage](index), encoding="utf-8")
    lines = Logs()
    again, report = load(corpus, log=lines)
    assert not report.cache_hit and report.cache_path == str(corpus / "cache")
    assert_same_store(store, again)
    notes = [line for line in lines if line.startswith("note:") and "damaged" in line]
    assert len(notes) == 1 and str(index_path) in notes[0], lines
    assert load(corpus)[1].cache_hit  # the rebuilt cache holds


def test_bad_clips_are_skipped_and_reported(corpus: Path) -> None:
    store, _ = load(corpus)
    bad, gone, empty = store.ids[2], store.ids[5], store.ids[7]
    (corpus / "wavs" / f"{bad}.wav").write_bytes(b"this is not a wav file at all" * 10)
    (corpus / "wavs" / f"{gone}.wav").unlink()
    sf.write(corpus / "wavs" / f"{empty}.wav", np.zeros(0, dtype=np.int16), SR, subtype="PCM_16")
    logs = Logs()
    store2, report = load(corpus, log=logs)
    assert report.clips == 21 and len(store2) == 21
    reasons = dict(report.skipped)
    assert set(reasons) == {bad, gone, empty}
    assert "missing" in reasons[gone] and "unreadable" in reasons[bad] and "empty" in reasons[empty]
    assert bad not in store2.ids and gone not in store2.ids
    assert any("3 clip(s) could not be read and are skipped" in m for m in logs)
    # the surviving clips are unchanged
    for clip_id in store2.ids:
        np.testing.assert_array_equal(
            store2.clip(store2.ids.index(clip_id)), store.clip(store.ids.index(clip_id))
        )
    # a cache hit still reports what was skipped
    _, report = load(corpus)
    assert report.cache_hit and set(dict(report.skipped)) == {bad, gone, empty}


def test_wrong_rate_and_stereo_clips_are_converted(corpus: Path) -> None:
    rows = (corpus / "metadata.csv").read_text().splitlines()
    ids = [r.split("|")[0] for r in rows]
    t = np.arange(22050) / 22050
    sf.write(corpus / "wavs" / f"{ids[0]}.wav", 0.3 * np.sin(2 * np.pi * 220 * t), 22050, subtype="PCM_16")
    stereo = np.stack([np.full(SR, 0.25), np.full(SR, 0.5)], axis=1)
    sf.write(corpus / "wavs" / f"{ids[1]}.wav", stereo, SR, subtype="PCM_16")
    loud = np.concatenate([np.full(100, 1.5), np.full(100, -0.5)]).astype(np.float32)
    sf.write(corpus / "wavs" / f"{ids[2]}.wav", loud, SR, subtype="FLOAT")
    logs = Logs()
    store, report = load(corpus, log=logs)
    assert report.resampled == 1
    assert store.clip(2)[0] == 32767 and store.clip(2)[150] == round(-0.5 * 32767)  # clipped, not wrapped
    assert abs(store.num_samples(0) - SR) <= 1  # one second at the target rate
    assert np.abs(store.clip(0)).max() == pytest.approx(0.3 * 32768, rel=0.03)
    assert store.num_samples(1) == SR and abs(int(store.clip(1)[SR // 2]) - int(0.375 * 32768)) <= 1
    resample_lines = [m for m in logs if "resampled" in m]
    assert len(resample_lines) == 1 and "prepare_data.py" in resample_lines[0]


def test_memmap_mode_gives_same_clips(corpus: Path) -> None:
    in_ram, _ = load(corpus)
    logs = Logs()
    mapped, report = load(corpus, max_ram_gb=1e-9, log=logs)
    assert report.cache_hit and not report.in_ram and isinstance(mapped.audio, np.memmap)
    assert any("memory-mapping" in m for m in logs)
    assert_same_store(in_ram, mapped)
    # pickling (spawned workers) re-opens the map instead of copying the audio
    blob = pickle.dumps(mapped)
    assert len(blob) < mapped.audio.nbytes / 4
    back = pickle.loads(blob)
    assert isinstance(back.audio, np.memmap)
    assert_same_store(in_ram, back)


def test_ram_limit_is_shared_by_the_processes_of_a_launch(corpus: Path, monkeypatch) -> None:
    # every process of an accelerate launch preloads its own copy: two copies must fit, not one
    _, report = load(corpus)
    limit_gb = 1.5 * report.bytes / 2**30
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    _, report = load(corpus, max_ram_gb=limit_gb)
    assert report.cache_hit and not report.in_ram
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    _, report = load(corpus, max_ram_gb=limit_gb)
    assert report.in_ram
    for stray in ("", "auto", "0"):  # not a process count: one process, as before the variable was read
        monkeypatch.setenv("LOCAL_WORLD_SIZE", stray)
        _, report = load(corpus, max_ram_gb=limit_gb)
        assert report.in_ram


def test_unwritable_cache_dir_loads_into_ram(corpus: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file_not_dir"
    blocker.write_text("x")
    logs = Logs()
    store, report = load(corpus, cache_dir=blocker / "cache", log=logs)
    assert report.in_ram and report.cache_path is None and len(store) == 24
    assert sum("cannot write the clip cache" in m for m in logs) == 1
    reference, _ = load(corpus)
    assert_same_store(reference, store)


def test_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such data folder"):
        load(tmp_path / "nope")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "metadata.csv").write_text("only-one-field\n")
    with pytest.raises(UserError, match="no usable rows"):
        load(tmp_path / "d")
    (tmp_path / "d" / "metadata.csv").write_text("a|abc|0\n")
    with pytest.raises(UserError, match="none of the 1 listed clips"):
        load(tmp_path / "d")


def test_metadata_problems_are_reported_not_fatal(corpus: Path) -> None:
    meta = corpus / "metadata.csv"
    meta.write_text(meta.read_text() + "broken line without fields\n")
    logs = Logs()
    store, report = load(corpus, log=logs)
    assert len(store) == 24 and len(report.metadata_problems) == 1
    assert any("unusable line" in m for m in logs)


def test_metadata_saved_by_a_windows_editor_keeps_every_clip(corpus: Path) -> None:
    """A transcript fixed by hand in Notepad/Excel: a byte-order mark and CRLF line ends. The mark was
    read into the first id, whose clip was then skipped as a missing file."""
    meta = corpus / "metadata.csv"
    meta.write_bytes(b"\xef\xbb\xbf" + meta.read_text(encoding="utf-8").replace("\n", "\r\n").encode())
    logs = Logs()
    store, report = load(corpus, log=logs)
    assert len(store) == 24 and not report.metadata_problems, logs
    assert not any("could not be read" in m for m in logs), logs


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_metadata_saved_as_unicode_by_notepad_keeps_every_clip(corpus: Path, encoding: str) -> None:
    # Notepad's "Unicode" (UTF-16 with its byte-order mark) was refused as "not UTF-8 text (invalid
    # start byte at byte 0)", though prepare_data.py reads such a file
    meta = corpus / "metadata.csv"
    text = meta.read_text(encoding="utf-8").replace("\n", "\r\n")
    meta.write_bytes(("\ufeff" + text).encode(encoding))
    store, report = load(corpus)
    assert len(store) == 24 and not report.metadata_problems
    assert store.texts == [line.split("|")[1] for line in text.splitlines()]


def test_metadata_saved_as_latin1_names_the_line_and_the_fix(corpus: Path) -> None:
    # refused as "not UTF-8 text (invalid continuation byte at byte 123)": no line to look at, no fix
    meta = corpus / "metadata.csv"
    lines = meta.read_text(encoding="utf-8").splitlines()
    first, text, speaker = lines[4].split("|")
    lines[4] = f"{first}|caf\u00e9 {text}|{speaker}"
    meta.write_bytes("\n".join(lines).encode("latin-1"))
    with pytest.raises(UserError, match=r"metadata\.csv: line 5 is not UTF-8 text .*save it as UTF-8"):
        load(corpus)


# --- speakers, items, split -----------------------------------------------------------------------


def test_speaker_map() -> None:
    logs = Logs()
    assert speaker_map(["a", "b", "a"], 1, log=logs) == {"a": 0, "b": 0}
    assert len(logs) == 1 and "2 speakers" in logs[0]
    assert speaker_map(["x"], 0, log=logs) == {"x": 0} and len(logs) == 1
    # integer names below num_speakers keep their id, others fill the gaps in sorted order
    assert speaker_map(["3", "bob", "0", "alice", "07"], 8) == {"0": 0, "3": 3, "07": 1, "alice": 2, "bob": 4}
    assert speaker_map(["12", "5"], 6) == {"5": 5, "12": 0}
    with pytest.raises(UserError, match="3 distinct speakers"):
        speaker_map(["a", "b", "c"], 2)


def test_build_items_drops_unalignable(corpus: Path) -> None:
    store, _ = load(corpus)
    hop = 256
    store.texts[4] = "a" * (store.num_samples(4) // hop + 1)  # one token more than frames
    store.texts[6] = "!!!"  # no tokens
    tokenize = lambda text: [t for t in char_tokenize(text) if t > 0]  # noqa: E731
    mapping = speaker_map(store.speakers, 2)
    items, dropped = build_items(store, range(len(store)), tokenize, mapping, hop, log=quiet)
    assert {d[0] for d in dropped} == {store.ids[4], store.ids[6]}
    assert "frames" in dict(dropped)[store.ids[4]]
    assert len(items) == 22 and 4 not in items.indices and 6 not in items.indices
    assert all(t.dtype == np.int64 for t in items.token_ids) and items.speaker_ids.dtype == np.int64
    np.testing.assert_array_equal(items.speaker_ids, [mapping[store.speakers[i]] for i in items.indices])
    np.testing.assert_array_equal(items.audio_lengths(), [store.num_samples(i) for i in items.indices])


def test_split_is_deterministic_and_order_free() -> None:
    ids = [f"utt{i:04d}" for i in range(100)]
    train, val = split_train_val(ids, 0.1, seed=1)
    assert len(val) == 10 and sorted(train + val) == list(range(100))
    assert split_train_val(ids, 0.1, seed=1) == (train, val)
    shuffled = list(reversed(ids))
    _, val2 = split_train_val(shuffled, 0.1, seed=1)
    assert {shuffled[i] for i in val2} == {ids[i] for i in val}
    _, val3 = split_train_val(ids, 0.1, seed=2)
    assert val3 != val
    # adding clips keeps the old validation clips in validation whenever it keeps its size
    assert len(split_train_val(ids, 0.01, min_val=4)[1]) == 4
    assert len(split_train_val(ids, 0.5, max_val=7)[1]) == 7
    # tiny sets: fewer val items, never an empty training set
    train, val = split_train_val(["a", "b", "c"], 0.1, min_val=4)
    assert len(val) == 2 and len(train) == 1
    with pytest.raises(UserError):
        split_train_val(["a"], 0.1)


# --- sampler --------------------------------------------------------------------------------------


def padding_ratio(batches: list[list[int]], lengths: np.ndarray) -> float:
    padded = sum(len(b) * lengths[b].max() for b in batches)
    return 1.0 - sum(lengths[b].sum() for b in batches) / padded


def test_sampler_covers_every_index_once_and_is_seeded() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(10_000, 200_000, size=203)
    sampler = BucketBatchSampler(lengths, batch_size=8, seed=5, bucket_size_multiplier=4)
    epoch0 = list(sampler)
    assert len(epoch0) == len(sampler) == 26
    assert sorted(i for b in epoch0 for i in b) == list(range(203))
    assert list(sampler) == epoch0  # same (seed, epoch)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0 and sorted(i for b in epoch1 for i in b) == list(range(203))
    other = BucketBatchSampler(lengths, batch_size=8, seed=5, bucket_size_multiplier=4)
    other.set_epoch(1)
    assert list(other) == epoch1

    dropped = BucketBatchSampler(lengths, batch_size=8, seed=5, drop_last=True)
    batches = list(dropped)
    assert len(batches) == len(dropped) == 25 and all(len(b) == 8 for b in batches)


def test_sampler_set_start_skips_once() -> None:
    sampler = BucketBatchSampler(np.arange(100) + 1, batch_size=4, seed=0)
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_start(7)
    assert list(sampler) == full[7:]
    assert list(sampler) == full  # only once


def test_sampler_shards_are_disjoint_and_equal() -> None:
    lengths = np.random.default_rng(1).integers(1000, 5000, size=101)
    for drop_last in (False, True):
        shards = []
        for rank in range(3):
            s = BucketBatchSampler(
                lengths, batch_size=4, seed=9, num_replicas=3, rank=rank, drop_last=drop_last
            )
            s.set_epoch(2)
            shards.append(list(s))
            assert len(shards[-1]) == len(s)
        assert len({len(s) for s in shards}) == 1
        seen = [i for s in shards for b in s for i in b]
        if drop_last:
            assert len(seen) == len(set(seen))  # fully disjoint
        else:
            assert set(seen) == set(range(101))  # covered; repeats only from the padding batches
            assert len(seen) - 101 < 3 * 4
        # disjoint apart from padding: the first shard-length-minus-one batches never overlap
        firsts = [set(i for b in s[:-1] for i in b) for s in shards]
        assert not (firsts[0] & firsts[1]) and not (firsts[1] & firsts[2]) and not (firsts[0] & firsts[2])


def test_a_steps_samples_count_each_of_the_epochs_clips_once_on_any_number_of_ranks() -> None:
    """With several processes a step's samples were one rank's clips times the ranks: at an epoch's end a
    rank's repeat of an earlier batch (equal shares) and a short last batch counted as full, so 36 clips
    in batches of 8 on 2 ranks counted 40 or 48 an epoch. samples_in counts what the ranks trained of
    the epoch, each clip once, the same number on every rank."""
    lengths = np.random.default_rng(2).integers(1000, 5000, size=36)
    for replicas in (1, 2, 3):
        for drop_last in (False, True):
            ranks = [
                BucketBatchSampler(lengths, 8, seed=4, num_replicas=replicas, rank=r, drop_last=drop_last)
                for r in range(replicas)
            ]
            for epoch in range(3):
                for s in ranks:
                    s.set_epoch(epoch)
                shards = [list(s) for s in ranks]
                for i in range(len(ranks[0])):  # per step, the same count on every rank
                    assert len({s.samples_in(i, i + 1) for s in ranks}) == 1
                distinct = len({c for shard in shards for b in shard for c in b})
                trained = sum(len(b) for shard in shards for b in shard)
                counted = sum(ranks[0].samples_in(i, i + 1) for i in range(len(ranks[0])))
                assert counted == ranks[0].samples_in(0, len(ranks[0])) == distinct
                assert distinct == (
                    8 * (4 // replicas) * replicas if drop_last else 36
                )  # drop_last: equal whole shares
                if replicas == 1:  # one process: every clip it trained
                    assert counted == trained
    # the replay sampler counts its epoch's draw the same way
    replay = [
        ReplayBatchSampler(lengths, range(10), range(10, 36), 17, 4, seed=1, num_replicas=2, rank=r)
        for r in range(2)
    ]
    for s in replay:
        s.set_epoch(1)
    assert sum(replay[0].samples_in(i, i + 1) for i in range(len(replay[0]))) == 27
    assert replay[1].samples_in(0, len(replay[1])) == 27


def test_a_steps_sample_count_follows_its_own_epochs_batches() -> None:
    """samples_in keeps the epoch's batch sizes between steps: kept into the next epoch, whose short
    batch falls elsewhere, a step's count was another epoch's batch's."""
    lengths = np.random.default_rng(2).integers(1000, 5000, size=36)
    bucket = BucketBatchSampler(lengths, 8, seed=4)
    replay = ReplayBatchSampler(lengths, range(10), range(10, 36), 17, 4, seed=1)
    for sampler in (bucket, replay):
        orders = set()
        for epoch in range(6):
            sampler.set_epoch(epoch)
            sizes = [len(b) for b in sampler]
            assert [sampler.samples_in(i, i + 1) for i in range(len(sizes))] == sizes, (epoch, sizes)
            orders.add(tuple(sizes))
        assert len(orders) > 1  # the short batch moved: the check above can tell the epochs apart


def test_the_batch_order_is_random_not_by_length() -> None:
    # A corpus within one pool (fewer clips than batch_size * bucket_size_multiplier) is one length-sorted
    # run of batches: the epoch must not then go from the shortest batch to the longest every time.
    lengths = np.random.default_rng(3).integers(16_000, 240_000, size=160)
    sampler = BucketBatchSampler(lengths, batch_size=8, seed=0)
    first_batches = set()
    for epoch in range(4):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        means = [float(lengths[b].mean()) for b in batches]
        assert means != sorted(means) and means != sorted(means, reverse=True)
        ranks = np.argsort(np.argsort(means))
        assert abs(np.corrcoef(np.arange(len(means)), ranks)[0, 1]) < 0.7  # no trend with position
        first_batches.add(tuple(batches[0]))
    assert len(first_batches) == 4


def test_bucketing_cuts_padding() -> None:
    lengths = np.random.default_rng(2).integers(16_000, 240_000, size=2000)
    bucketed = list(BucketBatchSampler(lengths, batch_size=16, seed=0))
    rng = np.random.default_rng(0)
    perm = rng.permutation(2000)
    random_batches = [perm[i : i + 16].tolist() for i in range(0, 2000, 16)]
    ratio_bucketed, ratio_random = padding_ratio(bucketed, lengths), padding_ratio(random_batches, lengths)
    assert ratio_bucketed < 0.08 and ratio_random > 0.3
    assert ratio_bucketed < ratio_random / 5

    val = BucketBatchSampler(lengths, batch_size=16, shuffle=False)
    batches = list(val)
    assert batches == list(val)
    flat = [i for b in batches for i in b]
    assert np.all(np.diff(lengths[flat]) >= 0)  # sorted by length


# --- collation and loader -------------------------------------------------------------------------


def test_collate_shapes_dtypes_values() -> None:
    a1 = np.array([100, -32768, 32767], dtype=np.int16)
    a2 = np.array([1, 2, 3, 4, 5], dtype=np.int16)
    items = [
        {"token_ids": np.array([4, 5], dtype=np.int64), "audio": a1, "speaker_id": 3, "index": 10},
        {"token_ids": np.array([1, 2, 3, 9], dtype=np.int64), "audio": a2, "speaker_id": 0, "index": 2},
    ]
    b = collate_batch(items)
    assert b["input_ids"].tolist() == [[4, 5, 0, 0], [1, 2, 3, 9]]
    assert b["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert b["text_lengths"].tolist() == [2, 4] and b["audio_lengths"].tolist() == [3, 5]
    assert b["speaker_ids"].tolist() == [3, 0] and b["indices"].tolist() == [10, 2]
    assert b["audio"].shape == (2, 1, 5) and b["audio"].dtype == torch.float32
    for key in ("input_ids", "attention_mask", "text_lengths", "audio_lengths", "speaker_ids", "indices"):
        assert b[key].dtype == torch.int64, key
    expected = np.zeros((2, 1, 5), np.float32)
    expected[0, 0, :3] = a1 / 32768.0
    expected[1, 0, :] = a2 / 32768.0
    np.testing.assert_array_equal(b["audio"].numpy(), expected)
    assert b["audio"].min() == -1.0


@pytest.mark.parametrize("mapped", [False, True])
def test_loader_workers_match_main_process(corpus: Path, mapped: bool) -> None:
    store, _ = load(corpus, max_ram_gb=1e-9 if mapped else 0.0)
    assert store.in_ram is not mapped
    items, _ = build_items(
        store, range(len(store)), char_tokenize, speaker_map(store.speakers, 2), 256, log=quiet
    )

    def epoch_batches(workers: int) -> list[dict[str, torch.Tensor]]:
        sampler = BucketBatchSampler(items.audio_lengths(), batch_size=5, seed=4, bucket_size_multiplier=2)
        sampler.set_epoch(1)
        loader = make_loader(items, sampler, num_workers=workers, pin_memory=False)
        out = list(loader)
        sampler.set_epoch(2)
        out += list(loader)  # persistent workers see the new epoch
        return out

    serial, parallel = epoch_batches(0), epoch_batches(2)
    assert len(serial) == len(parallel) == 10
    for a, b in zip(serial, parallel, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    ds = ClipDataset(items)
    first = ds[0]
    assert first["audio"].dtype == np.int16 and first["index"] == 0
    assert items.clip_id(first["index"]) == store.ids[int(items.indices[0])]


def test_copy_of_cache_elsewhere_is_a_hit(corpus: Path, tmp_path: Path) -> None:
    """The cache only depends on the data, not on where the cache lives."""
    load(corpus)
    shutil.copytree(corpus / "cache", tmp_path / "elsewhere")
    _, report = load(corpus, cache_dir=tmp_path / "elsewhere")
    assert report.cache_hit


def test_disk_full_while_writing_cache_falls_back_to_ram(corpus: Path, monkeypatch) -> None:
    import vits_trainer.data.clipstore as clipstore

    def no_space(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(clipstore.os, "fsync", no_space)
    logs = Logs()
    store, report = load(corpus, log=logs)
    assert len(store) == 24 and report.in_ram and report.cache_path is None
    assert any("No space left" in m for m in logs)
    assert not list((corpus / "cache").glob("*.tmp-*")) and not (corpus / "cache" / INDEX_NAME).exists()


def test_a_small_corpus_keeps_most_of_its_clips_for_training():
    from vits_trainer.data.items import held_out_positions

    sizes = {
        n: len(held_out_positions([f"c{i}" for i in range(n)], 0.02, seed=0)) for n in (2, 3, 5, 8, 16, 400)
    }
    assert sizes == {2: 1, 3: 1, 5: 1, 8: 2, 16: 4, 400: 8}  # at least 4, but never most of a small corpus
    assert held_out_positions([f"c{i}" for i in range(50)], 0.0, seed=0) == []


def test_the_warning_about_unusable_metadata_lines_says_how_many_it_does_not_show(tmp_path: Path) -> None:
    from vits_trainer.data.clipstore import _read_listing

    (tmp_path / "metadata.csv").write_text("a|hello\n" + "|\n" * 5, encoding="utf-8")
    lines: list[str] = []
    _, rows, _ = _read_listing(tmp_path, lines.append)
    assert len(rows) == 1
    assert lines[0].startswith(f"warning: {tmp_path / 'metadata.csv'}: 5 unusable line(s) ignored (line 2")
    assert lines[0].endswith("; and 2 more)")


def test_the_data_line_of_a_feedback_round_counts_what_an_epoch_trains():
    """A feedback round's pool (its clips and every original one it may replay) was printed as its
    training clips: '151 training clips' for 14 trained per epoch."""
    from types import SimpleNamespace

    from vits_trainer.training.datasplit import DataSplit, describe_data

    class Items:
        sample_rate = 16000

        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def audio_lengths(self):
            return np.full(self.n, 16000 * 3)

    report = SimpleNamespace(seconds=0.1, cache_hit=True, cache_path=None, in_ram=True)
    lines = []
    plain = DataSplit(None, Items(151), {"val": Items(16)}, [])
    describe_data(plain, report, lines.append)
    feedback = DataSplit(None, Items(151), {"feedback": Items(3), "val": Items(16)}, [], epoch_samples=14)
    describe_data(feedback, report, lines.append)
    assert lines[0].startswith("data: 151 training clips (0.13 h), 16 val;")
    assert lines[1].startswith(
        "data: 14 clips trained per epoch, drawn from 151 training clips (0.13 h), 3 feedback"
    )
    # --val_fraction 0 printed "data: 151 training clips (0.13 h), ; loaded in ..."
    for val_sets in ({}, {"val": Items(0)}):
        describe_data(DataSplit(None, Items(151), val_sets, []), report, lines.append)
        assert lines[-1].startswith("data: 151 training clips (0.13 h), no validation clips; loaded in")


def test_a_folder_prepare_data_did_not_make_gets_no_cache_written_into_it(tmp_path: Path) -> None:
    # a corpus passed as --data_dir as it came (an LJSpeech download has wavs/ + metadata.csv) trained,
    # and a cache/ folder of ours was left inside the user's corpus
    raw = tmp_path / "LJSpeech-1.1"
    (raw / "wavs").mkdir(parents=True)
    made = tmp_path / "made"
    make_corpus(made, num_clips=6, sample_rate=SR, seed=1)
    for wav in (made / "wavs").iterdir():
        shutil.copy(wav, raw / "wavs" / wav.name)
    shutil.copy(made / "metadata.csv", raw / "metadata.csv")
    before = sorted(p.relative_to(raw) for p in raw.rglob("*"))
    lines: list[str] = []
    store, report = load(raw, log=lines.append)
    assert len(store) == 6 and store.in_ram and not report.cache_hit
    assert sorted(p.relative_to(raw) for p in raw.rglob("*")) == before  # nothing written into it
    note = [line for line in lines if "not written" in line]
    assert len(note) == 1 and "prepare_data.py" in note[0] and str(raw) in note[0]
    # the folders this tool made keep their cache: prepare_data.py's, and the generated ones
    for prepared in (made, raw):
        if prepared is raw:
            (raw / "prepare_report.json").write_text('{"counts": {}, "settings": {}}', encoding="utf-8")
        load(prepared)
        _, report = load(prepared)
        assert report.cache_hit and (prepared / "cache").is_dir()


def test_a_cache_folder_of_the_users_own_is_left_untouched(tmp_path: Path) -> None:
    # a cache/ folder in the data folder was taken for the clip cache: the tool wrote audio_int16.bin
    # into it and deleted the index.json it found there
    def files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    made = tmp_path / "made"
    make_corpus(made, num_clips=6, sample_rate=SR, seed=1)
    raw = tmp_path / "corpus"
    shutil.copytree(made / "wavs", raw / "wavs")
    shutil.copy(made / "metadata.csv", raw / "metadata.csv")
    for folder in (raw, made):  # a corpus of the user's, and one prepare_data.py made
        (folder / "cache").mkdir()
        (folder / "cache" / "index.json").write_text('{"pages": [1, 2]}', encoding="utf-8")
        (folder / "cache" / "notes.txt").write_text("mine", encoding="utf-8")
        before = files(folder)
        for _ in range(2):
            lines: list[str] = []
            store, report = load(folder, log=lines.append)
            assert len(store) == 6 and store.in_ram and not report.cache_hit
            assert files(folder) == before
            note = [line for line in lines if line.startswith("note:") and "cache" in line]
            assert len(note) == 1 and str(folder / "cache") in note[0] and "untouched" in note[0], lines
        with pytest.raises(UserError, match="--max_ram_gb"):
            load(folder, max_ram_gb=1e-6)
        assert files(folder) == before


def test_a_clip_cache_of_ours_is_recognised_also_one_written_before_caches_were_marked(
    tmp_path: Path,
) -> None:
    corpus = tmp_path / "data"
    make_corpus(corpus, num_clips=6, sample_rate=SR, seed=1)
    load(corpus)
    marks = [p for p in (corpus / "cache").iterdir() if p.name not in (AUDIO_NAME, INDEX_NAME)]
    assert len(marks) == 1  # the cache says it is the tool's
    marks[0].unlink()
    (corpus / "prepare_report.json").unlink(missing_ok=True)
    (corpus / ".prepare_state.json").unlink()  # even in a folder that does not say who made it
    _, report = load(corpus)
    assert report.cache_hit


def test_an_unmarked_cache_left_by_a_killed_build_is_still_the_tools(tmp_path: Path) -> None:
    # an older version wrote no mark: killed while building (its first cache, or a rebuild that had
    # dropped the old index), it left only files of the cache's own names, and the folder was then taken
    # for the user's: never written again, a note blamed files "this tool did not write", and a corpus
    # above the RAM share was refused where its cache would have been memory-mapped
    corpus = tmp_path / "data"
    make_corpus(corpus, num_clips=6, sample_rate=SR, seed=1)
    cache = corpus / "cache"
    for left in ([AUDIO_NAME + ".tmp-99999"], [AUDIO_NAME, INDEX_NAME + ".tmp-99999", ".probe-99999"]):
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        for name in left:
            (cache / name).write_bytes(b"\0" * 64)
        lines = Logs()
        store, report = load(corpus, max_ram_gb=1e-6, log=lines)
        assert len(store) == 6 and not store.in_ram and report.cache_path == str(cache), lines
        assert not any("untouched" in line for line in lines), lines
        assert load(corpus)[1].cache_hit
    # a name like the cache's but without a writer's pid (a user's index.json.tmp-old) is not the tool's
    shutil.rmtree(cache)
    cache.mkdir()
    (cache / (INDEX_NAME + ".tmp-old")).write_text("mine", encoding="utf-8")
    store, report = load(corpus)
    assert store.in_ram and not report.cache_path
    assert [p.name for p in cache.iterdir()] == [INDEX_NAME + ".tmp-old"]
    # a cache/ holding only an index.json that is not the tool's stays the user's
    shutil.rmtree(cache)
    cache.mkdir()
    (cache / INDEX_NAME).write_text('{"pages": [1, 2]}', encoding="utf-8")
    store, report = load(corpus)
    assert store.in_ram and not report.cache_path
    assert [p.name for p in cache.iterdir()] == [INDEX_NAME]


def test_an_empty_cache_folder_is_no_ones_and_gets_the_clip_cache(tmp_path: Path) -> None:
    # a cache/ emptied by hand (rm cache/*) holds nothing of the user's: taken for theirs, it would never
    # be written again and every start would read the wavs into RAM
    corpus = tmp_path / "data"
    make_corpus(corpus, num_clips=6, sample_rate=SR, seed=1)
    (corpus / "cache").mkdir()
    lines = Logs()
    store, report = load(corpus, max_ram_gb=1e-6, log=lines)
    assert len(store) == 6 and not store.in_ram and report.cache_path == str(corpus / "cache"), lines
    assert not any("untouched" in line for line in lines), lines
    assert load(corpus)[1].cache_hit


def test_a_folder_prepare_data_did_not_make_and_larger_than_the_ram_share_is_refused(tmp_path: Path) -> None:
    # such a folder gets no cache, so nothing can be memory-mapped: read whole into RAM by every process,
    # a corpus above --max_ram_gb's share would run the machine out of memory instead
    raw = tmp_path / "corpus"
    made = tmp_path / "made"
    make_corpus(made, num_clips=6, sample_rate=SR, seed=1)
    shutil.copytree(made / "wavs", raw / "wavs")
    shutil.copy(made / "metadata.csv", raw / "metadata.csv")
    before = sorted(p.relative_to(raw) for p in raw.rglob("*"))
    with pytest.raises(UserError) as err:
        load(raw, max_ram_gb=1e-6)
    assert "prepare_data.py --source" in str(err.value) and "--max_ram_gb" in str(err.value)
    assert sorted(p.relative_to(raw) for p in raw.rglob("*")) == before
    store, _ = load(raw)  # within the share: read into RAM as before
    assert len(store) == 6


def test_a_ram_share_counts_the_clips_of_a_folder_of_ours_as_int16(tmp_path: Path) -> None:
    # float32 wavs at 44.1 kHz take 5.5 times the RAM on disk that they take as int16 at 16 kHz: the
    # check used the files' sizes, and refused a corpus that fits
    import soxr

    raw = tmp_path / "corpus"
    made = tmp_path / "made"
    make_corpus(made, num_clips=6, sample_rate=SR, seed=1)
    (raw / "wavs").mkdir(parents=True)
    for wav in (made / "wavs").iterdir():
        audio, _ = sf.read(wav, dtype="float32")
        sf.write(raw / "wavs" / wav.name, soxr.resample(audio, SR, 44100), 44100, subtype="FLOAT")
    shutil.copy(made / "metadata.csv", raw / "metadata.csv")
    on_disk = sum(p.stat().st_size for p in (raw / "wavs").iterdir())
    as_int16 = sum(sf.info(p).frames for p in (made / "wavs").iterdir()) * 2
    assert on_disk > 4 * as_int16
    store, _ = load(raw, max_ram_gb=2 * as_int16 / 2**30)
    assert len(store) == 6 and store.in_ram
    with pytest.raises(UserError, match="--max_ram_gb"):
        load(raw, max_ram_gb=as_int16 / 2 / 2**30)


def test_an_ljspeech_metadata_read_as_it_came_says_its_third_column_is_no_speaker(tmp_path: Path) -> None:
    # LJSpeech's metadata.csv is id|text|normalised text: read as it came, every sentence became a
    # speaker name (12 speakers for 12 clips) and only a note about preparing the folder was said
    raw = tmp_path / "LJSpeech-1.1"
    make_corpus(raw, num_clips=12, sample_rate=SR, seed=2)
    (raw / ".prepare_state.json").unlink()
    lines = (raw / "metadata.csv").read_text(encoding="utf-8").splitlines()
    rows = [line.split("|") for line in lines]
    (raw / "metadata.csv").write_text("".join(f"{i}|{t}|{t.upper()}\n" for i, t, _ in rows), encoding="utf-8")
    said: list[str] = []
    store, _ = load(raw, log=said.append)
    assert len(set(store.speakers)) == 12
    warning = [line for line in said if line.startswith("warning:") and "third column" in line]
    assert len(warning) == 1 and "12 speaker names" in warning[0] and "LJSpeech" in warning[0]
    # a corpus of its own with real speaker names says nothing of the kind
    said.clear()
    two = tmp_path / "two"
    make_corpus(two, num_clips=12, sample_rate=SR, num_speakers=2, seed=2)
    (two / ".prepare_state.json").unlink()
    load(two, log=said.append)
    assert not [line for line in said if "third column" in line]


def test_speakers_named_in_full_are_not_taken_for_sentences(tmp_path: Path) -> None:
    # a speaker column of full names (two voices, each name with a space) was warned about as an
    # LJSpeech metadata.csv's sentences: sentences are one per clip, speakers are few
    raw = tmp_path / "named"
    make_corpus(raw, num_clips=12, sample_rate=SR, num_speakers=2, seed=2)
    (raw / ".prepare_state.json").unlink()
    names = {"0": "Ali Rezaei", "1": "Sara Ahmadi"}
    lines = (raw / "metadata.csv").read_text(encoding="utf-8").splitlines()
    rows = [line.split("|") for line in lines]
    assert {speaker for _, _, speaker in rows} == set(names)
    (raw / "metadata.csv").write_text(
        "".join(f"{i}|{t}|{names[sp]}\n" for i, t, sp in rows), encoding="utf-8"
    )
    said: list[str] = []
    store, _ = load(raw, log=said.append)
    assert set(store.speakers) == set(names.values())
    assert not [line for line in said if "third column" in line]


def test_the_preload_benchmarks_corpus_gets_its_cache(tmp_path: Path) -> None:
    # bench/bench_preload.py times a cold load (building the cache) against warm ones (reading it): a
    # folder of its own wavs and metadata.csv, if taken for a user's corpus, got no cache and the
    # benchmark stopped at the cache file it drops from the page cache
    from bench.bench_preload import make_data

    make_data(tmp_path / "data", 4, 0.2, SR)
    _, cold = load(tmp_path / "data")
    _, warm = load(tmp_path / "data")
    assert not cold.cache_hit and warm.cache_hit and (tmp_path / "data" / "cache" / AUDIO_NAME).is_file()


def test_the_free_space_a_cache_needs_is_counted_as_int16_not_as_the_wavs_size(
    tmp_path: Path, monkeypatch
) -> None:
    # float32 wavs at 44.1 kHz take 5.5 times the disk that the cache (int16 mono at 16 kHz) takes: the
    # check used the files' sizes, said "not enough free space" and read every clip into RAM instead
    import collections

    import soxr

    import vits_trainer.data.clipstore as clipstore

    data = tmp_path / "data"
    make_corpus(data, num_clips=6, sample_rate=SR, seed=1)
    as_int16 = sum(sf.info(p).frames for p in (data / "wavs").iterdir()) * 2
    for wav in (data / "wavs").iterdir():
        audio, _ = sf.read(wav, dtype="float32")
        sf.write(wav, soxr.resample(audio, SR, 44100), 44100, subtype="FLOAT")
    on_disk = sum(p.stat().st_size for p in (data / "wavs").iterdir())
    free = 2 * as_int16
    assert free < on_disk
    # mocked: a test cannot set the real free space of a disk; this much holds the cache, not the wavs
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(clipstore.shutil, "disk_usage", lambda path: usage(10 * on_disk, 0, free))
    logs = Logs()
    store, report = load(data, log=logs)
    assert len(store) == 6 and report.cache_path == str(data / "cache"), logs
    assert (data / "cache" / INDEX_NAME).is_file()
    assert not any("cannot write the clip cache" in m for m in logs)
    assert os.path.getsize(data / "cache" / AUDIO_NAME) <= free


def test_a_float_wav_with_nan_or_inf_samples_is_skipped_as_prepare_data_skips_it(corpus: Path) -> None:
    """A float WAV of a folder given as it came: NaN samples were cast to int16 (0 here, a numpy
    RuntimeWarning the only sign; the value is the platform's) and Inf clipped to full scale, so the clip
    trained as altered audio. Skipped and named instead, as prepare_data.py skips it."""
    store, _ = load(corpus)
    nan_id, inf_id = store.ids[3], store.ids[4]
    for clip_id, bad in ((nan_id, np.nan), (inf_id, np.inf)):
        audio = store.clip(store.ids.index(clip_id)).astype(np.float32) / 32768
        audio[100:200] = bad
        sf.write(corpus / "wavs" / f"{clip_id}.wav", audio, SR, subtype="FLOAT")
    logs = Logs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast"
        store2, report = load(corpus, log=logs)
    reasons = dict(report.skipped)
    assert set(reasons) == {nan_id, inf_id} and len(store2) == len(store) - 2
    assert reasons[nan_id] == reasons[inf_id] == "100 NaN/Inf samples"
    assert any("2 clip(s) could not be read and are skipped" in m for m in logs)


def test_a_missing_clip_names_the_file_looked_for(corpus: Path) -> None:
    """metadata.csv giving a file name as the id (`clip00001.wav|...`, as an LJSpeech list may): the
    warning said `clip00000.wav: missing file` beside an existing wavs/clip00000.wav; it names the file
    looked for."""
    rows = (corpus / "metadata.csv").read_text().splitlines()
    first = rows[0].split("|")[0]
    rows[0] = rows[0].replace(f"{first}|", f"{first}.wav|", 1)
    (corpus / "metadata.csv").write_text("\n".join(rows) + "\n")
    _, report = load(corpus)
    assert dict(report.skipped)[f"{first}.wav"] == f"missing file (wavs/{first}.wav.wav)"
