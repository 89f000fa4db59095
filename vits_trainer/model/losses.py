"""VITS training losses (Kim et al. 2021), as small pure functions.

Every function casts its inputs to float32 first: under autocast the model's outputs arrive as fp16 /
bf16, and squared errors, exponentials and long sums lose too much there (or overflow).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor


def columns(maps: list[Tensor], items: int | None = None) -> tuple[Tensor, tuple[int, ...]]:
    """Discriminator outputs as one matrix: (values [items, K] float32, each map's values per item);
    `items` defaults to the first map's.

    Each map [items, ...] is flattened per item and all are laid side by side, so a sum over maps of
    per-map means is one weighted sum (`column_weights`). One concatenation replaces a handful of
    operators (and their backward) per map: 37 maps at the VITS layout.
    """
    if not maps:
        raise ValueError("no discriminator outputs")
    items = maps[0].size(0) if items is None else items
    if any(m.size(0) != items for m in maps):
        raise ValueError(f"expected every map to hold {items} items")
    flat = torch.cat([m.reshape(items, -1) for m in maps], dim=1).float()
    return flat, tuple(math.prod(m.shape[1:]) for m in maps)


@functools.lru_cache(maxsize=16)
def column_weights(sizes: tuple[int, ...], n: int, device: torch.device) -> Tensor:
    """[K]: a column of a map with S values per item weighs 1 / (n * S), so that the weighted sum over
    n items is the sum over maps of per-map means."""
    # a step's segments have a fixed size, so this is built once per shape, not once per step
    per_map = torch.tensor([1.0 / (n * s) for s in sizes], dtype=torch.float32)
    return torch.repeat_interleave(per_map, torch.tensor(sizes)).to(device)


def discriminator_loss(logits: list[Tensor], n: int) -> Tensor:
    """Least-squares GAN loss for the discriminator: sum over sub-discriminators of
    mean((1 - real)^2) + mean(fake^2). `logits`: per sub-discriminator [2n, ...] from one pass over
    [real; fake], real items first."""
    flat, sizes = columns(logits, 2 * n)
    weights = column_weights(sizes, n, flat.device)
    return torch.sum(weights * ((1.0 - flat[:n]) ** 2 + flat[n:] ** 2))


def generator_adversarial_loss(logits: list[Tensor]) -> Tensor:
    """Least-squares GAN loss for the generator: sum over sub-discriminators of mean((1 - fake)^2).
    `logits`: per sub-discriminator [n, ...], from a pass over the generated segments alone."""
    fake, sizes = columns(logits)
    return torch.sum(column_weights(sizes, fake.size(0), fake.device) * (1.0 - fake) ** 2)


def feature_matching_loss(real: list[list[Tensor]], fake: list[list[Tensor]]) -> Tensor:
    """Sum over every sub-discriminator layer of mean(|real - fake|), real features detached.
    `real`, `fake`: per sub-discriminator, its feature maps [n, ...] of the recorded and of the
    generated segments (the real ones may come from the discriminator's own pass).

    The original VITS multiplies this sum by 2 inside the function; here the factor lives in
    `LossWeights.feature_matching` (2.0 by default), so this returns the plain sum.
    """
    fake_flat, sizes = columns([m for maps in fake for m in maps])
    n = fake_flat.size(0)
    with torch.no_grad():  # targets: no gradient, and no graph recorded for the concatenation
        real_flat, real_sizes = columns([m for maps in real for m in maps], n)
    if real_sizes != sizes:
        raise ValueError("the real and generated feature maps differ in shape")
    return torch.sum(column_weights(sizes, n, fake_flat.device) * torch.abs(real_flat - fake_flat))


def kl_loss(z_p: Tensor, logs_q: Tensor, m_p: Tensor, logs_p: Tensor, mask: Tensor) -> Tensor:
    """KL between the posterior sample pushed through the flow and the alignment-expanded prior.

    z_p, logs_q, m_p, logs_p: [B, C, T_frames] (logs = log standard deviation); mask: [B, 1, T_frames].
    Per element: logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p)^2 * exp(-2 logs_p); the masked sum is divided
    by the number of valid frames (not frames x channels), as in VITS.
    """
    z_p, logs_q, m_p, logs_p, mask = (t.float() for t in (z_p, logs_q, m_p, logs_p, mask))
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p) ** 2 * torch.exp(-2.0 * logs_p)
    # `where` rather than a bare product: an inf in a padded frame would otherwise turn into nan.
    kl = torch.where(mask > 0, kl * mask, torch.zeros((), device=kl.device))
    return kl.sum() / mask.sum().clamp_min(1.0)


def mel_reconstruction_loss(mel_fake: Tensor, mel_real: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean absolute error between the generated and the reference mel spectrograms.

    With `mask` ([B, 1, frames], 1 inside each clip) only the frames inside the clips count: used for
    full-length evaluation of a padded batch.
    """
    if mask is None:
        return torch.nn.functional.l1_loss(mel_fake.float(), mel_real.float())
    mask = mask.float()
    error = torch.where(mask > 0, (mel_fake.float() - mel_real.float()).abs(), 0.0)
    return error.sum() / (mask.sum() * mel_fake.size(1)).clamp_min(1.0)


def duration_loss_deterministic(log_durations_pred: Tensor, durations: Tensor, mask: Tensor) -> Tensor:
    """Squared error in log-duration space for the deterministic duration predictor.

    All inputs [B, 1, T_text]; target = log(durations + 1e-6). Padded tokens are masked out of both
    prediction and target, and the sum is divided by the number of valid tokens, as in VITS.
    """
    pred, durations, mask = log_durations_pred.float(), durations.float(), mask.float()
    target = torch.log(durations + 1e-6) * mask
    diff = torch.where(mask > 0, pred * mask - target, torch.zeros((), device=pred.device))
    return torch.sum(diff**2) / mask.sum().clamp_min(1.0)


def normalise_by_mask(total_per_item: Tensor, mask: Tensor) -> Tensor:
    """sum(total_per_item) / sum(mask): how VITS normalises the stochastic duration predictor's NLL."""
    return total_per_item.float().sum() / mask.float().sum().clamp_min(1.0)


@dataclass
class LossWeights:
    mel: float = 45.0
    kl: float = 1.0
    duration: float = 1.0
    adversarial: float = 1.0
    # VITS's factor 2 on feature matching, kept out of `feature_matching_loss` so it can be tuned.
    feature_matching: float = 2.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossWeights:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in known})


# the generator's loss terms, one per LossWeights field: a new term is a field here, a `--<name>_weight`
# flag (config.LOSS_WEIGHT_FLAGS) and an entry of step.py's `losses`
LOSS_KEYS = tuple(f.name for f in fields(LossWeights))


def generator_total(losses: dict[str, Tensor], weights: LossWeights) -> Tensor:
    """Weighted sum of the generator losses under the keys mel / kl / duration / adversarial /
    feature_matching. Absent keys contribute nothing; other keys (logging extras) are ignored: a new
    loss term trains only once it is one of LOSS_KEYS with a weight in LossWeights.
    """
    present = [k for k in LOSS_KEYS if k in losses]
    if not present:
        raise ValueError(f"no generator loss among {sorted(losses)}; expected some of {list(LOSS_KEYS)}")
    total = None
    for key in present:
        term = getattr(weights, key) * losses[key].float()
        total = term if total is None else total + term
    return total
