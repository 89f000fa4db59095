"""The clips a run trains and validates on, and their loaders: the clip store, the default train/validation
split (train_feedback.py brings its own through build_session's `data_fn`), the vocabulary check.

Apart from session.py so the set-up reads as its steps; these are the data steps.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data.clipstore import ClipStore, load_clip_store
from ..data.items import TrainingItems, build_items, held_out_positions
from ..data.loader import make_loader
from ..data.sampler import BucketBatchSampler
from ..data.shapes import PadLengths
from ..data.text import TextEncoder, extend_vocabulary
from ..errors import UserError
from .config import TrainConfig


@dataclass
class DataSplit:
    """The clips a run trains and validates on. `val_sets` maps a name to items; the first is primary."""

    store: ClipStore
    train: TrainingItems
    val_sets: dict[str, TrainingItems]
    val_ids: list[str]
    dropped: list[tuple[str, str]] = field(default_factory=list)
    # a custom batch sampler (e.g. feedback + a fresh replay draw each epoch); None = bucketed over `train`
    sampler: object | None = None
    epoch_samples: int | None = None  # samples one epoch of `sampler` yields; None = len(train)
    feedback_clips: int | None = None  # feedback clips among `train` (train_feedback.py), else None
    val_trained_clips: int = 0  # clips of the first validation set also trained on (a small feedback round)

    @property
    def samples_per_epoch(self) -> int:
        return self.epoch_samples if self.epoch_samples is not None else len(self.train)


def load_store(
    cfg: TrainConfig, data_dir: Path, sample_rate: int, accelerator, log
) -> tuple[ClipStore, object]:
    """The clip store, built once: the main process fills the cache, the others then read it."""
    if not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: no such folder (run prepare_data.py first)")
    with accelerator.main_process_first():
        store, report = load_clip_store(
            data_dir,
            sample_rate,
            max_ram_gb=cfg.max_ram_gb,
            log=log,
            progress=accelerator.is_main_process,
        )
    return store, report


def report_unknown_characters(text: TextEncoder, texts: list[str], log, extend: bool = False) -> list[str]:
    """List the characters the vocabulary lacks; `extend`: --extend_vocab adds them next, so they are
    not dropped."""
    missing = text.unknown_characters(texts)
    if missing:
        shown = ", ".join(f"{ch!r}×{n}" for ch, n in missing.most_common(15))
        more = f" and {len(missing) - 15} more" if len(missing) > 15 else ""
        fate = "--extend_vocab adds them" if extend else "the tokenizer drops them"
        log(f"characters the model's vocabulary lacks ({fate}): {shown}{more}")
    return list(missing)


def check_vocabulary(cfg: TrainConfig, model, text: TextEncoder, store: ClipStore, log) -> None:
    """A new run: characters the vocabulary lacks are reported, or added with --extend_vocab."""
    unknown = report_unknown_characters(text, store.texts, log, extend=cfg.extend_vocab)
    if unknown and cfg.extend_vocab:
        added = extend_vocabulary(model, text, unknown, Path(tempfile.mkdtemp(prefix="vocab-")))
        log(f"vocabulary extended by {len(added)} character(s): {''.join(added)!r}")
    elif unknown and "extend_vocab" not in cfg.hidden_flags:
        log("  (pass --extend_vocab to add them to the vocabulary instead)")


def split_data(
    cfg: TrainConfig,
    store: ClipStore,
    text: TextEncoder,
    speakers: dict[str, int],
    hop: int,
    val_ids: list[str] | None,
    log,
) -> DataSplit:
    """Train/validation items. A resumed run passes its stored `val_ids` so the split never moves."""
    positions = np.arange(len(store))
    if cfg.max_samples:
        positions = positions[: cfg.max_samples]
    ids = [store.ids[i] for i in positions]
    fresh_split = val_ids is None  # a resume keeps its split, whatever --val_fraction says now
    if fresh_split:
        val_ids = [ids[i] for i in held_out_positions(ids, cfg.val_fraction, cfg.seed)]
    wanted = set(val_ids)
    val_idx = [int(positions[i]) for i, clip_id in enumerate(ids) if clip_id in wanted]
    train_idx = [int(positions[i]) for i, clip_id in enumerate(ids) if clip_id not in wanted]
    missing = len(wanted) - len(val_idx)
    if missing:
        log(f"warning: {missing} validation clip(s) of the earlier run are no longer in the data")
    # each warning names its set: "1 of 2 clip(s) dropped" of a corpus of 12 read as the whole corpus's
    train, dropped = build_items(
        store, train_idx, text.encode, speakers, hop, log=log, what="training clip(s)"
    )
    val_idx = interleave_voices(val_idx, store.speakers, speakers)
    val, dropped_val = build_items(
        store, val_idx, text.encode, speakers, hop, log=log, what="validation clip(s)"
    )
    if len(train) == 0:
        raise UserError(f"no usable training clips in {cfg.data_dir} (see the warnings above)")
    # a voice whose every clip was held out (or dropped) keeps an embedding no step trains, and is
    # exported in speakers.json like the others: one clip per speaker put whole voices in validation.
    # Every voice of the data counts, as in the map: --max_samples leaves clips out, not voices
    present = set(store.speakers)  # the names this data speaks
    spoken = {speakers[name] for name in present if name in speakers}
    untrained = sorted(spoken - set(train.speaker_ids.tolist()))
    if len(set(speakers.values())) > 1 and untrained:
        log(
            f"warning: {len(untrained)} of {len(spoken)} voices have no training clip "
            f"({voices_named(speakers, untrained)}): their clips are all held out for validation, dropped"
            + (", or past --max_samples" if cfg.max_samples else "")
            + ", so no step trains their "
            "speaker embedding; give them more clips, or train without validation (--val_fraction 0)"
        )
    if len(val) == 0 and cfg.val_fraction > 0:
        log("warning: no usable validation clips: no validation, no best_model")
    elif fresh_split and len(val):  # --val_fraction 0 holds out nothing on purpose: no voice was left out
        # the voices this data speaks: the map also names voices with no clip here (an exported base's
        # speakers.json, kept with their ids), which a larger --val_fraction would not hold out either
        note = unscored_voices_note(
            {n: i for n, i in speakers.items() if n in present}, val.speaker_ids.tolist()
        )
        if note:
            log(note)
    return DataSplit(store, train, {"val": val} if len(val) else {}, val_ids, dropped + dropped_val)


def unscored_voices_note(speakers: dict[str, int], val_speaker_ids: list[int], limit: int = 8) -> str | None:
    """A `note:` naming the voices of a multi-speaker model that no validation clip speaks: every
    evaluation leaves them unscored and no sample speaks them (the split is random, not per voice);
    None when each voice has one, or there is one voice."""
    voices = sorted(set(speakers.values()))
    if len(voices) < 2:
        return None
    missing = [sid for sid in voices if sid not in set(val_speaker_ids)]
    if not missing:
        return None
    return (
        f"note: {len(missing)} of {len(voices)} voices have no validation clip "
        f"({voices_named(speakers, missing, limit)}): no "
        "evaluation scores them and no sample speaks them; a larger --val_fraction holds out more clips"
    )


def voices_named(speakers: dict[str, int], voices: list[int], limit: int = 8) -> str:
    """The first `limit` of `voices` (ids of `speakers`), each by its names joined with " / ", and how
    many more."""
    shown = ", ".join(
        " / ".join(sorted(n for n, v in speakers.items() if v == sid)) for sid in voices[:limit]
    )
    return shown + (f" and {len(voices) - limit} more" if len(voices) > limit else "")


def interleave_voices(positions: list[int], names: list[str], speakers: dict[str, int]) -> list[int]:
    """Validation `positions` (into the store, whose speaker names are `names`) reordered so that each
    voice of `speakers` comes once before any comes again, voices in id order, each voice's clips in
    their own order. The samples (--eval_samples) and the free-running scores (--freerun_samples) take
    the first clips: in store order a multi-speaker run could hear one voice only. A single voice keeps
    the order it has."""
    return by_voice(positions, [speakers.get(names[position], -1) for position in positions])


def by_voice(positions: list[int], voices: list[int]) -> list[int]:
    """`positions` reordered so that each voice comes once before any comes again, voices in id order,
    each voice's positions in their own order; `voices[k]` is the voice id of `positions[k]`. One voice:
    the order as it is."""
    groups: dict[int, list[int]] = {}
    for position, voice in zip(positions, voices, strict=True):
        groups.setdefault(int(voice), []).append(position)
    if len(groups) < 2:
        return list(positions)
    ordered = [groups[voice] for voice in sorted(groups)]
    return [group[k] for k in range(max(map(len, ordered))) for group in ordered if k < len(group)]


def _cache_word(report) -> str:
    if report.cache_hit:
        return "cache"
    return "built cache" if report.cache_path else "no cache"


def describe_data(data: DataSplit, report, log) -> None:
    trained = f"{len(data.train)} training clips ({_hours(data.train):.2f} h)"
    if data.samples_per_epoch != len(data.train):  # a feedback round: its clips and a replay draw
        trained = f"{data.samples_per_epoch} clips trained per epoch, drawn from {trained}"
    held_out = ", ".join(f"{len(v)} {k}" for k, v in data.val_sets.items() if len(v))
    log(
        f"data: {trained}, {held_out or 'no validation clips'}"
        + f"; loaded in {report.seconds:.1f} s ({_cache_word(report)}, "
        f"{'RAM' if report.in_ram else 'memory-mapped'})"
    )  # clips that could not be read were named when the clip store was loaded


def make_loaders(
    cfg: TrainConfig, data: DataSplit, accelerator, pad: PadLengths | None = None
) -> tuple[object, object, dict[str, object]]:
    """(training batch sampler, training loader, validation loaders by name). `pad`: training batches
    padded to bucket edges (validation is not the hot path: its batches keep their own lengths)."""
    sampler = data.sampler or BucketBatchSampler(
        data.train.audio_lengths(),
        cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    pin = accelerator.device.type == "cuda"
    loader = make_loader(data.train, sampler, cfg.num_workers, pin, pad)
    # validation one clip at a time: no padding and no neighbours, so the same weights score the same
    # whatever --batch_size (batched, val_mel moved ~1 % between batch 1 and 16)
    val_loaders = {
        name: make_loader(items, BucketBatchSampler(items.audio_lengths(), 1, shuffle=False), 0, pin)
        for name, items in data.val_sets.items()
    }
    return sampler, loader, val_loaders


def _hours(items: TrainingItems) -> float:
    return float(items.audio_lengths().sum()) / items.sample_rate / 3600
