"""From items to padded batches: the Dataset, `collate_batch` and the DataLoader that joins them, and
`move_batch`, which puts a batch on the device.

Items are small dicts of numpy views (cheap to pickle into workers); `collate_batch` pads them into
preallocated arrays (to the longest item, or to the bucket edge above it: shapes.py) and turns the
int16 audio into float32 once, per batch.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .items import TrainingItems
from .sampler import BucketBatchSampler
from .shapes import PadLengths, padded_widths

# collate_batch's entries the networks do not take, kept on the host: the clips' ids (the loop counts
# a step's clips and names a skipped step's) and the token counts (the model counts attention_mask)
HOST_ONLY_KEYS = ("indices", "text_lengths")


def move_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`batch` on `device` without making the host wait. To a GPU every tensor is copied from pinned
    memory: the loader pins its batches, but micro-batches merged from several of them are new tensors,
    and a copy from pageable memory may wait for every kernel queued before it (CUDA stages it through
    pinned memory), leaving the GPU idle at each micro-batch. BatchEncoding.to() is avoided on purpose."""
    pin = device.type == "cuda"
    return {
        k: (v.pin_memory() if pin and not v.is_pinned() else v).to(device, non_blocking=True)
        for k, v in batch.items()
    }


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


def collate_batch(items: list[dict[str, Any]], pad: PadLengths | None = None) -> dict[str, torch.Tensor]:
    """Pad into preallocated numpy arrays and wrap them as tensors (no extra copy), audio as float32.
    `pad`: widths rounded up to bucket edges (shapes.py); None: the longest item's."""
    b = len(items)
    text_lengths = np.fromiter((len(it["token_ids"]) for it in items), dtype=np.int64, count=b)
    audio_lengths = np.fromiter((len(it["audio"]) for it in items), dtype=np.int64, count=b)
    t_max, s_max = padded_widths(
        pad, int(text_lengths.max()) if b else 0, int(audio_lengths.max()) if b else 0
    )
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


def leave_stop_signals(worker_id: int) -> None:
    """A DataLoader worker leaves Ctrl-C and SIGTERM to the main process, which finishes its step and
    saves. A terminal's Ctrl-C (or `timeout`, `kill -- -PGID`) reaches every process of the group: a
    worker killed by it ended the run with a traceback, unsaved, and one that kept the main process's
    handler (inherited through fork) printed the stop line again. So each worker gets a process group
    of its own, and ignores SIGINT sent to it alone. SIGTERM keeps torch's handler: the main process's
    own terminate() at shutdown ends a worker quietly."""
    if hasattr(os, "setpgrp"):  # POSIX
        os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_loader(
    items: TrainingItems,
    batch_sampler: BucketBatchSampler,
    num_workers: int,
    pin_memory: bool,
    pad: PadLengths | None = None,
) -> DataLoader:
    """A DataLoader over `items`; workers stay alive across epochs (the sampler lives in this process).
    `pad`: batches padded to bucket edges (shapes.py)."""
    extra: dict[str, Any] = {}
    if num_workers > 0:
        # a few batches ahead per worker hides collation; more only costs pinned RAM
        extra = {"persistent_workers": True, "prefetch_factor": 4, "worker_init_fn": leave_stop_signals}
        if sys.platform == "linux":
            # fork shares the preloaded audio copy-on-write; spawn/forkserver (Python 3.14's default)
            # would pickle a full copy of it into every worker
            extra["multiprocessing_context"] = "fork"
    return DataLoader(
        ClipDataset(items),
        batch_sampler=batch_sampler,
        collate_fn=collate_batch if pad is None else functools.partial(collate_batch, pad=pad),
        num_workers=num_workers,
        pin_memory=pin_memory,
        **extra,
    )
