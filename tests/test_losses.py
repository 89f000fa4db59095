"""VITS losses against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from vits_trainer.model.losses import (
    LossWeights,
    discriminator_loss,
    duration_loss_deterministic,
    feature_matching_loss,
    generator_adversarial_loss,
    generator_total,
    kl_loss,
    mel_reconstruction_loss,
    normalise_by_mask,
)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_discriminator_loss_by_hand() -> None:
    # n = 1: the real item first, then the fake one, per sub-discriminator
    logits = [t([[0.5, 1.0], [0.25, 0.0]]), t([[0.0], [-1.0]])]
    # disc 0: real ((1-0.5)^2 + (1-1)^2) / 2 = 0.125; fake (0.25^2 + 0) / 2 = 0.03125
    # disc 1: real (1-0)^2 = 1.0; fake (-1)^2 = 1.0
    assert discriminator_loss(logits, 1).item() == pytest.approx(0.125 + 0.03125 + 1.0 + 1.0)


def test_generator_adversarial_loss_by_hand() -> None:
    logits = [t([[0.5, 1.0]]), t([[-1.0]])]  # one generated item
    # (0.25 + 0) / 2 + (1 - -1)^2 = 0.125 + 4
    assert generator_adversarial_loss(logits).item() == pytest.approx(4.125)


def test_feature_matching_loss_by_hand() -> None:
    real = [[t([[1.0, 2.0]]), t([[[0.0]]])], [t([[3.0]])]]
    fake = [[t([[0.0, 4.0]]), t([[[-0.5]]])], [t([[3.0]])]]
    # (|1-0| + |2-4|) / 2 = 1.5; |0 - -0.5| = 0.5; 0 -> 2.0 (no factor 2: that lives in LossWeights)
    assert feature_matching_loss(real, fake).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="differ in shape"):
        feature_matching_loss([[t([[1.0]]), t([[[0.0]]])], [t([[3.0]])]], fake)


def test_feature_matching_detaches_real() -> None:
    real = t([[1.0, 2.0]]).requires_grad_()
    fake = t([[0.0, 0.0]]).requires_grad_()
    feature_matching_loss([[real]], [[fake]]).backward()
    assert real.grad is None  # nothing flows into the real features
    assert fake.grad.tolist() == [[-0.5, -0.5]]


def test_paired_losses_equal_the_per_map_definitions() -> None:
    """The concatenated forms give the VITS sums of per-map means (maps of a VITS-like layout)."""
    torch.manual_seed(0)
    n = 3
    shapes = [(16, 40), (64, 10), (1, 10), (8, 7, 2), (1, 7, 2), (8, 5, 3), (1, 5, 3)]
    maps = [torch.randn(2 * n, *s) for s in shapes]
    logits = [maps[2].flatten(1), maps[4].flatten(1), maps[6].flatten(1)]
    features = [maps[:3], maps[3:5], maps[5:]]
    want_d = sum(torch.mean((1 - x[:n]) ** 2) + torch.mean(x[n:] ** 2) for x in logits)
    want_g = sum(torch.mean((1 - x[n:]) ** 2) for x in logits)
    want_fm = sum(torch.mean(torch.abs(m[:n] - m[n:])) for fs in features for m in fs)
    torch.testing.assert_close(discriminator_loss(logits, n), want_d)
    torch.testing.assert_close(generator_adversarial_loss([x[n:] for x in logits]), want_g)
    real = [[m[:n] for m in fs] for fs in features]
    fake = [[m[n:] for m in fs] for fs in features]
    torch.testing.assert_close(feature_matching_loss(real, fake), want_fm)
    with pytest.raises(ValueError):
        discriminator_loss(logits, 2)  # 6 items are not 2 real + 2 fake


def _kl_inputs():
    # B=1, C=2, T=3; the last frame is padding.
    z_p = t([[[1.0, 0.0, 9.0], [0.5, 2.0, -9.0]]])
    logs_q = t([[[0.0, 0.5, 3.0], [0.0, 0.0, 3.0]]])
    m_p = t([[[0.0, 0.0, 1.0], [0.5, 1.0, 1.0]]])
    logs_p = t([[[0.0, math.log(2.0), -5.0], [0.0, 0.0, -5.0]]])
    mask = t([[[1.0, 1.0, 0.0]]])
    return z_p, logs_q, m_p, logs_p, mask


def test_kl_loss_by_hand() -> None:
    # term = logs_p - logs_q - 0.5 + 0.5 (z_p - m_p)^2 exp(-2 logs_p)
    # c0 f0: 0 - 0 - 0.5 + 0.5 * 1 * 1 = 0
    # c0 f1: ln2 - 0.5 - 0.5 + 0 = ln2 - 1
    # c1 f0: 0 - 0 - 0.5 + 0 = -0.5
    # c1 f1: 0 - 0 - 0.5 + 0.5 * 1 * 1 = 0
    # sum = ln2 - 1.5, over 2 valid frames (not frames x channels)
    expected = (math.log(2.0) - 1.5) / 2
    assert kl_loss(*_kl_inputs()).item() == pytest.approx(expected, abs=1e-6)


def test_kl_loss_ignores_masked_frames() -> None:
    z_p, logs_q, m_p, logs_p, mask = _kl_inputs()
    base = kl_loss(z_p, logs_q, m_p, logs_p, mask)
    z_p[..., 2] = 1e4
    logs_p[..., 2] = -100.0  # exp(200) overflows float32: inf in a padded frame must not leak
    logs_q[..., 2] = float("nan")
    assert torch.equal(kl_loss(z_p, logs_q, m_p, logs_p, mask), base)


def test_mel_reconstruction_loss_by_hand() -> None:
    fake = t([[[1.0, 2.0], [3.0, 4.0]]])
    real = t([[[0.0, 2.0], [5.0, 4.5]]])
    # (1 + 0 + 2 + 0.5) / 4
    assert mel_reconstruction_loss(fake, real).item() == pytest.approx(0.875)


def test_masked_mel_loss_is_the_mean_over_the_clips_frames_and_every_channel() -> None:
    # full-length evaluation of a padded batch: the same per-element mean as the unmasked loss over the
    # frames inside each clip, whatever the padding holds
    fake = t([[[1.0, 2.0, 9.0], [3.0, 4.0, -9.0]], [[0.0, 1.0, 7.0], [1.0, 1.0, 7.0]]])
    real = t([[[0.0, 2.0, 0.0], [5.0, 4.5, 0.0]], [[0.0, 0.0, 0.0], [1.0, 3.0, 0.0]]])
    mask = t([[[1.0, 1.0, 0.0]], [[1.0, 1.0, 0.0]]])  # the third frame is padding in both clips
    # (1 + 0 + 2 + 0.5) + (0 + 1 + 0 + 2) over 2 clips x 2 frames x 2 channels
    assert mel_reconstruction_loss(fake, real, mask).item() == pytest.approx(6.5 / 8)
    assert mel_reconstruction_loss(fake, real, mask).item() == pytest.approx(
        mel_reconstruction_loss(fake[..., :2], real[..., :2]).item()
    )


def test_duration_loss_by_hand() -> None:
    durations = t([[[1.0, math.e - 1e-6, 4.0]]])
    mask = t([[[1.0, 1.0, 0.0]]])
    pred = t([[[1.0, 0.5, 123.0]]])
    # targets log(1 + 1e-6) ~ 1e-6 and log(e) = 1: (1 - 1e-6)^2 + (0.5 - 1)^2 ~ 1.25, over 2 tokens
    assert duration_loss_deterministic(pred, durations, mask).item() == pytest.approx(0.625, abs=1e-5)
    # the padded token's prediction and duration do not matter
    pred[..., 2] = -7.0
    durations[..., 2] = 0.0
    assert duration_loss_deterministic(pred, durations, mask).item() == pytest.approx(0.625, abs=1e-5)


def test_normalise_by_mask() -> None:
    assert normalise_by_mask(
        t([3.0, 5.0]), t([[[1.0, 1.0, 0.0]], [[1.0, 1.0, 1.0]]])
    ).item() == pytest.approx(8.0 / 5.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_give_float32(dtype: torch.dtype) -> None:
    # Values exactly representable in both half formats, so the float32 results match exactly.
    logits = t([[0.5, 1.0], [0.25, 0.0]])
    fmap = t([[1.0, 2.0], [0.0, 4.0]])
    kl_in, mel = _kl_inputs(), (t([[1.0, 2.0]]), t([[0.0, 2.5]]))
    dur = (t([[[1.0, 0.5]]]), t([[[1.0, 2.0]]]), t([[[1.0, 1.0]]]))
    kl_in = tuple(x.to(dtype).float() for x in kl_in)  # round once so both runs see the same numbers

    def cast(x):
        return x.to(dtype)

    results = [
        (discriminator_loss([logits], 1), discriminator_loss([cast(logits)], 1)),
        (generator_adversarial_loss([logits]), generator_adversarial_loss([cast(logits)])),
        (
            feature_matching_loss([[fmap[:1]]], [[fmap[1:]]]),
            feature_matching_loss([[cast(fmap[:1])]], [[cast(fmap[1:])]]),
        ),
        (kl_loss(*kl_in), kl_loss(*(cast(x) for x in kl_in))),
        (mel_reconstruction_loss(*mel), mel_reconstruction_loss(*(cast(x) for x in mel))),
        (duration_loss_deterministic(*dur), duration_loss_deterministic(*(cast(x) for x in dur))),
    ]
    for full, half in results:
        assert half.dtype == torch.float32
        assert half.item() == full.item()


def test_loss_weights_and_total() -> None:
    weights = LossWeights()
    assert weights.to_dict() == {
        "mel": 45.0,
        "kl": 1.0,
        "duration": 1.0,
        "adversarial": 1.0,
        "feature_matching": 2.0,
    }
    assert LossWeights.from_dict({**weights.to_dict(), "unknown": 3}) == weights
    losses = {
        "mel": t(0.1),
        "kl": t(2.0),
        "duration": t(0.5),
        "adversarial": t(3.0),
        "feature_matching": t(1.5),
        "disc_logging_only": t(100.0),
    }
    # 45 * 0.1 + 2 + 0.5 + 3 + 2 * 1.5 = 13
    assert generator_total(losses, weights).item() == pytest.approx(13.0)
    # no adversarial terms yet (e.g. warm-up): they simply do not contribute
    assert generator_total({"mel": t(0.1), "kl": t(2.0)}, weights).item() == pytest.approx(6.5)
    with pytest.raises(ValueError, match="no generator loss"):
        generator_total({"other": t(1.0)}, weights)


def test_every_loss_term_has_its_weight_flag():
    """A term added to LossWeights without its --<name>_weight flag (or the other way) is never trained."""
    from vits_trainer.model.losses import LOSS_KEYS
    from vits_trainer.training.config import LOSS_WEIGHT_FLAGS, TrainConfig

    assert tuple(f"{key}_weight" for key in LOSS_KEYS) == LOSS_WEIGHT_FLAGS
    assert set(LOSS_WEIGHT_FLAGS) <= set(TrainConfig.__dataclass_fields__)
