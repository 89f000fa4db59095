"""Self-repair when training goes numerically wrong or runs out of GPU memory.

- Non-finite steps are skipped by the step itself (no weights touched). After `--max_consecutive_skips`
  of them in a row the run is stuck in a bad region: `Recovery` reloads the last good weights (the
  newest checkpoint, else the weights the run started from), halves the learning rate and leaves
  fp16 for bf16 (where supported) or fp32, and says so in one line.
- Out-of-memory inside a step: the caller frees what it holds and retries the cycle with every batch
  split in two (half the micro-batch, twice the accumulation: the same effective batch).
"""

from __future__ import annotations

import gc

import torch

from ..model.discriminator import VitsDiscriminator


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def split_batch(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """Cut a collated batch into `parts` smaller ones (as equal as possible; never an empty one).

    Padding is trimmed to each part's own longest item, so a part of short clips costs less memory.
    """
    size = batch["input_ids"].size(0)
    parts = max(1, min(parts, size))
    bounds = [round(i * size / parts) for i in range(parts + 1)]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        part = {k: v[lo:hi] for k, v in batch.items()}
        text_max = int(part["attention_mask"].sum(-1).max())
        audio_max = int(part["audio_lengths"].max())
        part["input_ids"] = part["input_ids"][:, :text_max]
        part["attention_mask"] = part["attention_mask"][:, :text_max]
        part["audio"] = part["audio"][..., :audio_max]
        out.append(part)
    return out


def switch_precision(accelerator, modules: list[torch.nn.Module], target: str) -> None:
    """Change the autocast dtype of a prepared run in place ("bf16" or "no"); drops the fp16 scaler.

    accelerate fixes the precision when it prepares a model (it wraps `forward` in an autocast of that
    dtype), so the wrapper is removed here; the step and the evaluation open `accelerator.autocast()`
    themselves, which follows the new setting.
    """
    accelerator.state._mixed_precision = target
    accelerator.native_amp = target != "no"
    accelerator.scaler = None
    for module in modules:
        if "_original_forward" in module.__dict__:
            # the instance attribute is the wrapper; without it the class's own forward is used again
            module.__dict__.pop("_original_forward")
            module.__dict__.pop("forward", None)


def next_precision(current: str) -> str | None:
    """Where to go after repeated non-finite steps: fp16 -> bf16 (if the GPU has it) -> fp32."""
    if current == "fp16":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16"
        return "no"
    if current == "bf16":
        return "no"
    return None


def restore_weights(
    model: torch.nn.Module,
    discriminator: VitsDiscriminator,
    generator_state: dict[str, torch.Tensor],
    discriminator_state: dict[str, torch.Tensor],
) -> None:
    with torch.no_grad():
        model.load_state_dict(generator_state, strict=True)
        discriminator.load_state_dict(discriminator_state, strict=True)


def all_finite(*modules: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for m in modules for p in m.parameters())
