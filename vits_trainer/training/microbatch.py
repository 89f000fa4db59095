"""How an optimiser step's clips are cut into micro-batches (how many clips a micro-batch holds is
chosen in microbatch_choice.py).

An optimiser step always trains on the same clips: `--gradient_accumulation_steps` loader batches of
`--batch_size` clips per process (the effective batch the user asked for). The micro-batch size only
decides how many clips go through the networks at once: the step's loader batches are merged and cut
into parts of at most that size, each part's gradients accumulated. The sampler, the data order and
the resume position (`TrainState.batch_in_epoch`, counted in loader batches at step boundaries) are
therefore the same whatever the micro-batch, and a resumed run may use another one. An epoch smaller
than a step is one step (`whole_step_samples`).
"""

from __future__ import annotations

import math

import torch

from ..data.shapes import PadLengths, padded_widths


def whole_step_samples(step_clips: int, processes: int, samples_per_epoch: int) -> int:
    """The samples one whole optimiser step trains, every process's together, each counted once (as the
    loop counts a step's samples): `step_clips` per process, or the whole epoch when it holds fewer."""
    return min(step_clips * processes, samples_per_epoch)


def accumulation_for(clips: int, micro: int) -> int:
    """Micro-batches a step of `clips` clips runs as (the gradient accumulation actually used)."""
    return max(1, math.ceil(clips / max(1, micro)))


def merge_batches(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One collated batch of several: padded dimensions (the last one of 2-D and larger tensors) are
    padded with zeros to the longest, then everything is concatenated along the batch dimension."""
    if len(batches) == 1:
        return batches[0]
    out = {}
    for key in batches[0]:
        parts = [b[key] for b in batches]
        if parts[0].dim() >= 2:
            width = max(p.size(-1) for p in parts)
            parts = [torch.nn.functional.pad(p, (0, width - p.size(-1))) for p in parts]
        out[key] = torch.cat(parts, dim=0)
    return out


def split_batch(
    batch: dict[str, torch.Tensor], parts: int, pad: PadLengths | None = None
) -> list[dict[str, torch.Tensor]]:
    """Cut a collated batch into `parts` smaller ones (as equal as possible; never an empty one).

    Padding is trimmed to each part's own longest item (to its bucket edge with `pad`, as the loader
    pads), so a part of short clips costs less memory.
    """
    size = batch["input_ids"].size(0)
    parts = max(1, min(parts, size))
    bounds = [round(i * size / parts) for i in range(parts + 1)]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        part = {k: v[lo:hi] for k, v in batch.items()}
        text_max, audio_max = padded_widths(
            pad, int(part["attention_mask"].sum(-1).max()), int(part["audio_lengths"].max())
        )
        # contiguous: a strided tensor is copied to a GPU through a pageable temporary however it was
        # pinned (ATen's copy_kernel_cuda), which makes move_batch's copy wait on the queued kernels
        part["input_ids"] = part["input_ids"][:, :text_max].contiguous()
        part["attention_mask"] = part["attention_mask"][:, :text_max].contiguous()
        part["audio"] = part["audio"][..., :audio_max].contiguous()
        out.append(part)
    return out


def micro_batches(
    pending: list[dict[str, torch.Tensor]], micro: int, pad: PadLengths | None = None
) -> list[dict[str, torch.Tensor]]:
    """A step's loader batches as micro-batches of at most `micro` clips (as equal as possible).

    When every loader batch already holds exactly `micro` clips (the requested split), they are used as
    they are: no copy, and the very micro-batches a run without this choice would have run. `pad`: the
    loader's bucket edges, kept when a batch is cut."""
    if all(b["input_ids"].size(0) == micro for b in pending):
        return list(pending)
    merged = merge_batches(pending)
    clips = merged["input_ids"].size(0)
    return split_batch(merged, accumulation_for(clips, micro), pad)
