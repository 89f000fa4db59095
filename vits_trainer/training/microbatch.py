"""How an optimiser step's clips are cut into micro-batches, and the trial that chooses the cut.

An optimiser step always trains on the same clips: `--gradient_accumulation_steps` loader batches of
`--batch_size` clips per process (the effective batch the user asked for). The micro-batch size only
decides how many clips go through the networks at once: the step's loader batches are merged and cut
into parts of at most that size, each part's gradients accumulated. The sampler, the data order and
the resume position (`TrainState.batch_in_epoch`, counted in loader batches at step boundaries) are
therefore the same whatever the micro-batch, and a resumed run may use another one.

With `--micro_batch_size auto` the first steps of training are a trial: a few real steps at each
micro-batch size from `--batch_size` up to the whole per-process batch that divides it (a larger
micro-batch does the same work in fewer, bigger passes: on a launch-bound GPU or a CPU it is faster).
Each size's first step is a warm-up (new shapes); its time per sample is the median of the rest. An
out-of-memory step rules that size (and every larger one) out. The fastest size wins; rank 0 decides.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from dataclasses import dataclass, field

import torch

from ..data.shapes import PadLengths, padded_widths
from .config import divisors

TRIAL_STEPS = 4  # per candidate: one warm-up step and three measured ones
TRIAL_STEPS_SHORT = 2  # when the budget is short: one warm-up, one measured
TRIAL_SHARE = 0.2  # the trial may take at most this share of the training time left (its steps train)


def candidates(cfg) -> list[int]:
    """The sizes a trial tries: from --batch_size up to the whole step's batch, those that divide it."""
    return [m for m in divisors(cfg.step_clips) if m >= cfg.batch_size]


def hardware_id(device: torch.device) -> str:
    """What a micro-batch choice depends on: the device's kind and name, and the CPU count."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
    return f"{device.type}: {name}; {os.cpu_count()} CPUs"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


@dataclass
class MicroBatchTrial:
    """The schedule and the measurements of a trial: `steps` steps at each size, smallest first."""

    sizes: list[int]
    steps: int
    # seconds per sample of each step at a size; None: counted, not measured (a retry, a short step)
    times: dict[int, list[float | None]] = field(default_factory=dict)
    excluded: list[int] = field(default_factory=list)  # ran out of memory
    _index: int = 0
    _count: int = 0

    @property
    def done(self) -> bool:
        return self._index >= len(self.sizes)

    def current(self) -> int:
        return self.sizes[self._index]

    def observe(self, size: int, seconds: float, samples: int, clean: bool = True) -> None:
        """One trial step at `size` ended. `clean`: its time measures this size (it ran once, at this
        size, on a whole step's clips)."""
        if self.done or size != self.current():
            return
        self.times.setdefault(size, []).append(seconds / samples if clean and samples > 0 else None)
        self._count += 1
        if self._count >= self.steps:
            self._index, self._count = self._index + 1, 0

    def exclude(self, size: int) -> None:
        """`size` ran out of memory: it and every larger size are out of the trial."""
        self.excluded.extend(m for m in self.sizes if m >= size and m not in self.excluded)
        self.sizes = [m for m in self.sizes if m < size]
        for m in list(self.times):
            if m >= size:
                del self.times[m]
        self._index = min(self._index, len(self.sizes))
        # the size in progress was the excluded one: the next untried one (if any) starts afresh
        if self._index < len(self.sizes) and self.sizes[self._index] in self.times:
            self._index += 1
        self._count = 0

    def seconds_per_sample(self, size: int) -> float | None:
        """Median after the warm-up step; None when no step after it was measured."""
        measured = [t for t in self.times.get(size, [])[1:] if t is not None]
        return statistics.median(measured) if measured else None

    def fastest(self) -> int | None:
        rates = {m: self.seconds_per_sample(m) for m in self.sizes}
        rates = {m: r for m, r in rates.items() if r is not None}
        return min(rates, key=rates.get) if rates else None

    def table(self) -> list[dict]:
        rows = []
        for m in sorted(set(self.sizes) | set(self.excluded)):
            rate = self.seconds_per_sample(m)
            rows.append(
                {
                    "micro_batch_size": m,
                    "steps": len(self.times.get(m, [])),
                    "measured_steps": len([t for t in self.times.get(m, [])[1:] if t is not None]),
                    "seconds_per_sample": rate,
                    "samples_per_second": (1.0 / rate) if rate else None,
                    "out_of_memory": m in self.excluded,
                }
            )
        return rows

    def describe(self) -> str:
        cells = []
        for row in self.table():
            m = row["micro_batch_size"]
            if row["out_of_memory"]:
                cells.append(f"{m} clips: out of memory")
            elif row["samples_per_second"] is None:
                cells.append(f"{m} clips: not measured")
            else:
                cells.append(
                    f"{m} clips: {row['samples_per_second']:.1f} samples/s "
                    f"(median of {row['measured_steps']} steps after a warm-up)"
                )
        return "micro-batch trial: " + " | ".join(cells)
