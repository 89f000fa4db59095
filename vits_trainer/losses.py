"""VITS training losses (Kim et al. 2021), as small pure functions.

Every function casts its inputs to float32 first: under autocast the model's outputs arrive as fp16 /
bf16, and squared errors, exponentials and long sums lose too much there (or overflow).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

LOSS_KEYS = ("mel", "kl", "duration", "adversarial", "feature_matching")


def discriminator_loss(
    real_logits: list[Tensor], fake_logits: list[Tensor]
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Least-squares GAN loss for the discriminator: sum over sub-discriminators of
    mean((1 - real)^2) + mean(fake^2).

    Returns (total, per-sub-discriminator real terms, fake terms); the per-term lists are detached
    0-d float32 tensors for logging (no device sync until someone reads them).
    """
    if len(real_logits) != len(fake_logits):
        raise ValueError(f"{len(real_logits)} real vs {len(fake_logits)} fake logits tensors")
    total = torch.zeros((), dtype=torch.float32, device=_device(real_logits))
    real_terms, fake_terms = [], []
    for real, fake in zip(real_logits, fake_logits, strict=True):
        real_term = torch.mean((1.0 - real.float()) ** 2)
        fake_term = torch.mean(fake.float() ** 2)
        total = total + real_term + fake_term
        real_terms.append(real_term.detach())
        fake_terms.append(fake_term.detach())
    return total, real_terms, fake_terms


def generator_adversarial_loss(fake_logits: list[Tensor]) -> Tensor:
    """Least-squares GAN loss for the generator: sum over sub-discriminators of mean((1 - fake)^2)."""
    total = torch.zeros((), dtype=torch.float32, device=_device(fake_logits))
    for fake in fake_logits:
        total = total + torch.mean((1.0 - fake.float()) ** 2)
    return total


def feature_matching_loss(real_features: list[list[Tensor]], fake_features: list[list[Tensor]]) -> Tensor:
    """Sum over every sub-discriminator layer of mean(|real - fake|), real features detached.

    The original VITS multiplies this sum by 2 inside the function; here the factor lives in
    `LossWeights.feature_matching` (2.0 by default), so this returns the plain sum.
    """
    if len(real_features) != len(fake_features):
        raise ValueError(f"{len(real_features)} real vs {len(fake_features)} fake feature-map lists")
    total = torch.zeros((), dtype=torch.float32, device=_device([m for ms in fake_features for m in ms]))
    for real_maps, fake_maps in zip(real_features, fake_features, strict=True):
        if len(real_maps) != len(fake_maps):
            raise ValueError(f"{len(real_maps)} real vs {len(fake_maps)} fake feature maps")
        for real, fake in zip(real_maps, fake_maps, strict=True):
            total = total + torch.mean(torch.abs(real.detach().float() - fake.float()))
    return total


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


def generator_total(losses: dict[str, Tensor], weights: LossWeights) -> Tensor:
    """Weighted sum of the generator losses under the keys mel / kl / duration / adversarial /
    feature_matching. Absent keys contribute nothing (e.g. no adversarial terms during a warm-up);
    other keys (logging extras) are ignored.
    """
    present = [k for k in LOSS_KEYS if k in losses]
    if not present:
        raise ValueError(f"no generator loss among {sorted(losses)}; expected some of {list(LOSS_KEYS)}")
    total = None
    for key in present:
        term = getattr(weights, key) * losses[key].float()
        total = term if total is None else total + term
    return total


def _device(tensors: list[Tensor]) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")
