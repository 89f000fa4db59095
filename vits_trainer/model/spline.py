"""The rational-quadratic spline of transformers' stochastic duration predictor, for training.

VITS's duration predictor is a normalising flow whose coupling layers transform half their channels by
a monotonic rational-quadratic spline on [-B, B] and leave values outside it unchanged (the
identity), as in Durkan et al., "Neural Spline Flows" (2019). transformers picks the values inside the
interval with boolean masks, checks their range and writes the results back through the masks. Each
of those asks the GPU how many values the mask selected: about ten waits for the device in every
coupling layer of every training step, during which nothing new is queued.

`spline_forward` computes the same transform for every value at once (values outside the interval
pass through the spline clamped to its edge, and the identity is selected afterwards): the same
numbers and gradients with fixed shapes and no read of the device. `install()` makes transformers
use it for the training direction; the inverse (speaking from text) stays transformers' own.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers.models.vits import modeling_vits

ORIGINAL = getattr(modeling_vits._unconstrained_rational_quadratic_spline, "original", None) or (
    modeling_vits._unconstrained_rational_quadratic_spline
)


def spline_forward(
    inputs: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float = 5.0,
    min_bin_width: float = 1e-3,
    min_bin_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs, log |d outputs / d inputs|) of the spline on [-tail_bound, tail_bound], the identity
    (log-determinant 0) outside it. `inputs` [...]; the unnormalised widths and heights [..., K], the
    derivatives [..., K - 1] at the inner knots (the two end knots have slope 1, matching the identity).

    Each coupling layer of every step runs this, forward and backward, so it is written for few
    operators: the knots along x and y in one tensor, and the six values a point needs (its bin's two
    knots along x and y, and the slopes at them) picked by one gather."""
    bins = unnormalized_widths.shape[-1]
    inside = inputs.abs() <= tail_bound
    x = inputs.clamp(-tail_bound, tail_bound)
    minimum = (
        min_bin_width
        if min_bin_width == min_bin_height
        else torch.tensor([[min_bin_width], [min_bin_height]], dtype=inputs.dtype, device=inputs.device)
    )
    unnormalized = torch.stack([unnormalized_widths, unnormalized_heights], dim=-2)  # [..., 2, K]
    sizes = minimum + (1 - minimum * bins) * F.softmax(unnormalized, dim=-1)
    inner = torch.cumsum(sizes[..., :-1], dim=-1) * (2 * tail_bound) - tail_bound
    # the end knots exactly at +-bound, whatever the rounding of the sizes' sum: [..., 2 (x, y), K + 1]
    knots = F.pad(F.pad(inner, (1, 0), value=-tail_bound), (0, 1), value=tail_bound)
    slopes = F.pad(min_derivative + F.softplus(unnormalized_derivatives), (1, 1), value=1.0)  # [..., K + 1]
    # the bin of each value: how many inner knots lie at or below it; then its two ends' knots and slopes
    k = (x.unsqueeze(-1) >= knots[..., 0, 1:-1]).sum(dim=-1, keepdim=True)
    table = torch.cat([knots, slopes.unsqueeze(-2)], dim=-2)  # [..., 3, K + 1]
    ends = torch.cat([k, k + 1], dim=-1).unsqueeze(-2).expand(*k.shape[:-1], 3, 2)
    x0, x1, y0, y1, d0, d1 = table.gather(-1, ends).flatten(-2).unbind(-1)
    width, height = x1 - x0, y1 - y0
    slope = height / width
    theta = (x - x0) / width
    rest = 1 - theta
    between = theta * rest
    denominator = slope + (d0 + d1 - 2 * slope) * between
    outputs = y0 + height * theta * (slope * theta + d0 * rest) / denominator
    derivative = slope.square() * (d1 * theta.square() + 2 * slope * between + d0 * rest.square())
    log_det = torch.log(derivative) - 2 * torch.log(denominator)
    return torch.where(inside, outputs, inputs), torch.where(inside, log_det, 0.0)


def _unconstrained(
    inputs,
    unnormalized_widths,
    unnormalized_heights,
    unnormalized_derivatives,
    reverse=False,
    tail_bound=5.0,
    min_bin_width=1e-3,
    min_bin_height=1e-3,
    min_derivative=1e-3,
):
    """transformers' signature: the training direction here, the inverse by transformers."""
    if reverse:
        return ORIGINAL(
            inputs,
            unnormalized_widths,
            unnormalized_heights,
            unnormalized_derivatives,
            reverse=True,
            tail_bound=tail_bound,
            min_bin_width=min_bin_width,
            min_bin_height=min_bin_height,
            min_derivative=min_derivative,
        )
    return spline_forward(
        inputs,
        unnormalized_widths,
        unnormalized_heights,
        unnormalized_derivatives,
        tail_bound,
        min_bin_width,
        min_bin_height,
        min_derivative,
    )


_unconstrained.original = ORIGINAL


def _guard_empty_spline() -> None:
    """transformers' inner spline (`_rational_quadratic_spline`, which the inverse still uses) raises on
    an empty input, which is what it gets when every value lies outside the tail bound: a diverged model
    (the feedback guard's regression case, a too-high learning rate) then crashed its own evaluation
    instead of being scored and judged. Outside the bound the spline is the identity, so an empty input
    has nothing to transform: return it unchanged with a zero log-determinant. A value whose spline is
    not finite (NaN weights: one step at --learning_rate 1e4) failed the inverse's check of its
    quadratic ("Discriminant has negative values"), a traceback at the next evaluation: it is NaN,
    as the forward direction makes it, and the others are transformed as before."""
    original = modeling_vits._rational_quadratic_spline
    if getattr(original, "empty_safe", False):
        return

    def spline(inputs, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, *args, **kwargs):
        if inputs.numel() == 0:
            return inputs, torch.zeros_like(inputs)
        knots = (unnormalized_widths, unnormalized_heights, unnormalized_derivatives)
        finite = torch.isfinite(inputs)
        for values in knots:
            finite &= torch.isfinite(values).all(dim=-1)
        if finite.all():
            return original(inputs, *knots, *args, **kwargs)
        outputs, log_det = torch.full_like(inputs, float("nan")), torch.full_like(inputs, float("nan"))
        if finite.any():
            outputs[finite], log_det[finite] = original(
                inputs[finite], *(values[finite] for values in knots), *args, **kwargs
            )
        return outputs, log_det

    spline.empty_safe = True
    modeling_vits._rational_quadratic_spline = spline


def install() -> None:
    """Once per process, at import of model/vits.py."""
    _guard_empty_spline()
    modeling_vits._unconstrained_rational_quadratic_spline = _unconstrained
