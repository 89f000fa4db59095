"""model/spline.py: the duration predictor's spline in the training direction gives transformers' numbers
and gradients, without reading the device; the inverse is still transformers' own."""

from __future__ import annotations

import torch
from transformers import VitsConfig, VitsModel
from transformers.models.vits import modeling_vits

import vits_trainer.model.vits  # noqa: F401  (installs the spline)
from vits_trainer.model.spline import ORIGINAL, spline_forward
from vits_trainer.model.stochastic_duration import ORIGINAL as transformers_forward
from vits_trainer.profiling import DeviceReads

BINS = 10


def _case(seed: int, shape=(3, 2, 40)):
    g = torch.Generator().manual_seed(seed)
    inputs = 4.0 * torch.randn(*shape, generator=g)  # ~20 % beyond the bound of 5
    inputs[0, 0, :3] = torch.tensor([-5.0, 5.0, 0.0])  # the ends and the middle exactly
    widths = torch.randn(*shape, BINS, generator=g)
    heights = torch.randn(*shape, BINS, generator=g)
    derivatives = torch.randn(*shape, BINS - 1, generator=g)
    return inputs, widths, heights, derivatives


def _with_grads(fn, tensors):
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    out, logdet = fn(*leaves)
    (out.sin().sum() + logdet.cos().sum()).backward()
    return out.detach(), logdet.detach(), [leaf.grad for leaf in leaves]


def test_same_outputs_log_determinants_and_gradients_as_transformers():
    for seed in range(3):
        case = _case(seed)
        assert ((case[0].abs() > 5).any()) and ((case[0].abs() < 5).any())
        ours = _with_grads(lambda *t: spline_forward(*t, tail_bound=5.0), case)
        theirs = _with_grads(lambda *t: ORIGINAL(*t, reverse=False, tail_bound=5.0), case)
        torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours[1], theirs[1], rtol=1e-4, atol=1e-4)
        for a, b in zip(ours[2], theirs[2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        outside = case[0].abs() > 5
        assert torch.equal(ours[0][outside], case[0][outside]) and not ours[1][outside].any()


def test_different_least_bin_widths_and_heights_as_transformers():
    case = _case(7)
    sizes = {"min_bin_width": 0.05, "min_bin_height": 1e-3, "min_derivative": 0.01}
    ours = _with_grads(lambda *t: spline_forward(*t, tail_bound=3.0, **sizes), case)
    theirs = _with_grads(lambda *t: ORIGINAL(*t, reverse=False, tail_bound=3.0, **sizes), case)
    for a, b in zip(ours[:2] + tuple(ours[2]), theirs[:2] + tuple(theirs[2]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_transformers_uses_it_forward_and_inverts_with_its_own():
    assert modeling_vits._unconstrained_rational_quadratic_spline.original is ORIGINAL
    inputs, widths, heights, derivatives = _case(5)
    out, logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        inputs, widths, heights, derivatives, tail_bound=5.0
    )
    back, back_logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        out, widths, heights, derivatives, reverse=True, tail_bound=5.0
    )
    torch.testing.assert_close(back, inputs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(back_logdet, -logdet, rtol=1e-3, atol=1e-3)
    # every value beyond the bound (a diverged model): the inverse passes them through too
    far = torch.tensor([[[-7.0, 9.0]]])
    back, back_logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        far, *(t[:1, :1, :2] for t in (widths, heights, derivatives)), reverse=True, tail_bound=5.0
    )
    assert torch.equal(back, far) and not back_logdet.any()


def test_the_duration_predictor_trains_without_reading_the_device():
    """The stochastic duration predictor's training pass, forward and backward, as the generator runs
    it: nothing in it waits for the device (transformers' own spline: ~10 waits per coupling layer)."""
    torch.manual_seed(0)
    config = VitsConfig(vocab_size=12, hidden_size=32, duration_predictor_filter_channels=32)
    predictor = VitsModel(config).duration_predictor
    batch, length = 2, 9
    hidden = torch.randn(batch, 32, length)
    mask = torch.ones(batch, 1, length)
    mask[1, :, 6:] = 0
    durations = torch.randint(1, 6, (batch, 1, length)).float() * mask
    reads = DeviceReads()
    with reads:
        nll = predictor(hidden, mask, durations=durations).sum()
        nll.backward()
    assert torch.isfinite(nll)
    assert reads.seen == [], reads.seen
    # transformers' own spline, on the same pass, does read (so the check above can fail)
    original = modeling_vits._unconstrained_rational_quadratic_spline
    modeling_vits._unconstrained_rational_quadratic_spline = ORIGINAL
    try:
        theirs = DeviceReads()
        with theirs:
            transformers_forward(predictor, hidden, mask, durations=durations).sum().backward()
    finally:
        modeling_vits._unconstrained_rational_quadratic_spline = original
    assert theirs.seen, "transformers' spline no longer reads the device: spline.py may be unneeded"


def test_the_inverse_of_a_diverged_model_is_nan_not_a_traceback():
    """NaN weights (one step at --learning_rate 1e4) made the inverse's quadratic NaN: transformers'
    check of it raised "Discriminant has negative values" in the next evaluation, a traceback."""
    inputs, widths, heights, derivatives = _case(3)
    good, good_logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        inputs, widths, heights, derivatives, reverse=True, tail_bound=5.0
    )
    widths = widths.clone()
    widths[1] = float("nan")
    back, back_logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        inputs, widths, heights, derivatives, reverse=True, tail_bound=5.0
    )
    inside = inputs.abs() < 5
    assert back[1][inside[1]].isnan().all() and back_logdet[1][inside[1]].isnan().all()
    torch.testing.assert_close(back[[0, 2]], good[[0, 2]])  # the finite ones: as before
    torch.testing.assert_close(back_logdet[[0, 2]], good_logdet[[0, 2]])
