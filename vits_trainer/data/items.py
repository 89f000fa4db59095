"""What the trainer iterates over: a tokenized subset of a clip store, and several such sets as one.

`build_items` drops the clips VITS cannot align, `speaker_map` gives speakers their embedding ids and
`split_train_val` holds clips out by a hash of their id. Nothing here reads audio: positions map to
views of the store (see clipstore.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from .clipstore import ClipStore, Log

# ---------------------------------------------------------------------------------------------------
# Speakers, tokens, validation split


def speaker_map(
    speakers: Sequence[str], num_speakers: int, log: Log = print, known: dict[str, int] | None = None
) -> dict[str, int]:
    """Map speaker names to embedding ids of a model with `num_speakers` speakers.

    Single-speaker models: everyone is 0. Multi-speaker: a name of `known` (the speakers.json of the
    model folder the run starts from) keeps its id there; a name that is a canonical integer below
    `num_speakers` keeps that id (data prepared with the checkpoint's own speaker ids), the other
    names take the free ids in sorted order, ids no known speaker has first. Known speakers absent from
    the data stay in the map with their ids, so the exported speakers.json still names every voice.
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
    known = {
        str(name): sid
        for name, sid in (known or {}).items()
        if isinstance(sid, int) and not isinstance(sid, bool) and 0 <= sid < num_speakers
    }
    # an exported model's voices keep their names: renumbered from this data alone (ali = 1, zin = 2
    # fine-tuned on ali and zin only became ali = 0, zin = 1), each trained the other's voice silently
    mapping: dict[str, int] = {name: known[name] for name in names if name in known}
    for name in names:
        if name not in mapping and name.isascii() and name.isdigit() and str(int(name)) == name:
            if int(name) < num_speakers and int(name) not in mapping.values():
                mapping[name] = int(name)
                whose = sorted(n for n, i in known.items() if i == int(name))
                if whose:  # data without a speaker column is all "0": it trains that id's named voice
                    log(
                        f"note: speaker {name!r} is not a name of the model's speakers.json; it trains "
                        f"speaker_id {name}, the voice of {', '.join(whose)} there"
                    )
    left = [i for i in range(num_speakers) if i not in mapping.values()]
    free = iter([i for i in left if i not in known.values()] + [i for i in left if i in known.values()])
    for name in names:
        if name not in mapping:
            mapping[name] = next(free)
            whose = sorted(n for n, i in known.items() if i == mapping[name])
            if whose:
                log(
                    f"note: speaker {name!r} takes speaker_id {mapping[name]}, the voice of "
                    f"{', '.join(whose)} in the model's speakers.json (not in this data): every other id is taken"
                )
    # (a voice another name of this data now trains is left out; two names of one voice there both stay)
    retrained = {sid for name, sid in mapping.items() if known.get(name) != sid}
    for name, sid in sorted(known.items()):
        if name not in mapping and sid not in retrained:
            mapping[name] = sid
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
    what: str = "clip(s)",
) -> tuple[TrainingItems, list[tuple[str, str]]]:
    """Tokenize the clips at `indices`; drop (and return as (id, reason)) the ones VITS cannot align.
    `what` names the clips in the warning ("validation clip(s)"): its count is of `indices` alone.

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
        more = f"; {len(dropped) - 3} more" if len(dropped) > 3 else ""
        log(f"warning: {len(dropped)} of {len(dropped) + len(kept)} {what} dropped ({first}{more})")
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

    Chosen by a hash of (seed, id) rather than row order, so every rank picks the same validation
    clips, and so does a recomputation after metadata.csv was reordered; clips added or removed can
    move others in or out (a resume uses the ids its checkpoint saved, never this).
    """
    n = len(ids)
    if n < 2:
        raise UserError(
            f"need at least 2 usable clips to hold one out for validation, got {n} "
            "(--val_fraction 0 trains without validation)"
        )
    k = max(min_val, round(val_fraction * n))
    if max_val is not None:
        k = min(k, max_val)
    k = max(0, min(k, n - 1))  # never leave training empty
    val = sorted(hash_order(ids, seed)[:k])
    val_set = set(val)
    return [i for i in range(n) if i not in val_set], val


def hash_order(ids: Sequence[str], seed: int) -> list[int]:
    """Positions into `ids` in the order a validation split takes them: by a hash of (seed, id)."""
    keys = [hashlib.blake2b(f"{seed}\0{clip_id}".encode(), digest_size=8).digest() for clip_id in ids]
    return sorted(range(len(ids)), key=lambda i: (keys[i], ids[i]))


def held_out_positions(ids: Sequence[str], val_fraction: float, seed: int) -> list[int]:
    """The validation positions of a training run (--val_fraction, --seed): at least 4 clips, but no
    more than a quarter of a small corpus (5 clips: 1 held out, 4 trained on), none at fraction 0."""
    if val_fraction <= 0:
        return []
    return split_train_val(ids, val_fraction, min_val=min(4, max(1, len(ids) // 4)), seed=seed)[1]


# ---------------------------------------------------------------------------------------------------
# Several item sets as one


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
