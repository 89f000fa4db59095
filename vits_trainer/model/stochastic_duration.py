"""The training direction of transformers' stochastic duration predictor, without a wait for the device.

VITS's duration predictor (Kim et al. 2021, section 2.2.2) bounds -log p(d | text) by variational
dequantisation: noise e ~ N(0, I) over two channels goes through the posterior flows to (u, nu), the
durations d - sigmoid(u) are taken to the log domain, and [log(d - u), nu] goes through the main flows
to a standard normal. transformers' forward draws that noise on the CPU and copies it to the model's
device (`torch.randn(...).to(device)`): on a GPU a copy from pageable memory synchronises the stream, so
every micro-step the host waited there for all the work queued before the duration predictor.

`duration_nll` is the same computation with the noise drawn on the device, from the same generator
call as transformers' on the CPU. It also keeps the flows' two channels as two tensors: transformers'
`torch.flip` of a two-channel tensor after each flow is a swap of the two names here, and each coupling
layer reads one half and rewrites the other without a split and a concatenation. Same values and
gradients (`tests/test_stochastic_duration.py`). `install()` makes transformers' module use it for the
training direction; speaking from text (the inverse) stays transformers' own.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F
from transformers.models.vits import modeling_vits

from .spline import spline_forward

ORIGINAL = (
    getattr(modeling_vits.VitsStochasticDurationPredictor.forward, "original", None)
    or modeling_vits.VitsStochasticDurationPredictor.forward
)
LOG_2PI = math.log(2 * math.pi)


def _affine(flow, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, frames: torch.Tensor):
    """transformers' VitsElementwiseAffine on the channels [a; b]: (a', b', log-determinant [B])."""
    scale = torch.exp(flow.log_scale)
    a = (flow.translate[:1] + scale[:1] * a) * mask
    b = (flow.translate[1:] + scale[1:] * b) * mask
    return a, b, flow.log_scale.sum() * frames


def _coupling(flow, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, conditioning: torch.Tensor):
    """transformers' VitsConvFlow on the channels [a; b]: b through a spline whose knots a (and the
    conditioning) decide. Returns (b', log |db'/db| per value, masked)."""
    hidden = flow.conv_pre(a)
    hidden = flow.conv_dds(hidden, mask, conditioning)
    hidden = flow.conv_proj(hidden) * mask  # [B, 3K - 1, T]
    batch, _, length = a.shape
    params = hidden.reshape(batch, 1, -1, length).permute(0, 1, 3, 2)  # [B, 1, T, 3K - 1]
    bins = flow.num_bins
    sizes = params[..., : 2 * bins] / math.sqrt(flow.filter_channels)
    b, log_det = spline_forward(
        b, sizes[..., :bins], sizes[..., bins:], params[..., 2 * bins :], tail_bound=flow.tail_bound
    )
    return b * mask, log_det * mask


def _flows(flows, a, b, mask, frames, conditioning):
    """The flows in order, each followed by transformers' flip of the two channels (a swap here).
    Returns (a, b, sum of log-determinants [B])."""
    a, b, log_det = _affine(flows[0], a, b, mask, frames)
    per_value = None
    for flow in flows[1:]:
        a, b = b, a  # the flip after the previous flow
        b, step = _coupling(flow, a, b, mask, conditioning)
        per_value = step if per_value is None else per_value + step
    a, b = b, a  # the flip after the last flow
    if per_value is not None:
        log_det = log_det + per_value.sum(dim=(1, 2))
    return a, b, log_det


def duration_nll(
    dp, inputs: torch.Tensor, padding_mask: torch.Tensor, global_conditioning, durations: torch.Tensor
) -> torch.Tensor:
    """[B]: -log p(d | text) bounded as transformers' `VitsStochasticDurationPredictor.forward` does in
    training. `inputs` [B, H, T] (the text encoder's output; not trained through here), `padding_mask`
    [B, 1, T], `durations` [B, 1, T] frames per token."""
    mask = padding_mask
    frames = mask.sum(dim=(1, 2))
    text = dp.conv_pre(inputs.detach())
    if global_conditioning is not None:
        text = text + dp.cond(global_conditioning.detach())
    text = dp.conv_proj(dp.conv_dds(text, mask)) * mask

    observed = dp.post_conv_pre(durations)
    observed = dp.post_conv_proj(dp.post_conv_dds(observed, mask)) * mask

    # the posterior q(u, nu | d, text): noise through the posterior flows, drawn where the model runs
    noise = torch.randn(durations.size(0), 2, durations.size(2), device=mask.device, dtype=mask.dtype) * mask
    u, nu, log_det_q = _flows(dp.post_flows, noise[:, :1], noise[:, 1:], mask, frames, text + observed)
    log_det_q = log_det_q + torch.sum((F.logsigmoid(u) + F.logsigmoid(-u)) * mask, dim=(1, 2))
    log_q = torch.sum(-0.5 * (LOG_2PI + noise.square()) * mask, dim=(1, 2)) - log_det_q

    # the prior: log(d - u) and nu through the main flows to a standard normal
    log_d = torch.log(torch.clamp_min((durations - torch.sigmoid(u)) * mask, 1e-5)) * mask
    a, b, log_det = _flows(dp.flows, log_d, nu, mask, frames, text)
    log_det = log_det - log_d.sum(dim=(1, 2))
    nll = torch.sum((LOG_2PI + 0.5 * (a.square() + b.square())) * mask, dim=(1, 2))  # two channels
    return nll - log_det + log_q


def forward(
    self, inputs, padding_mask, global_conditioning=None, durations=None, reverse=False, noise_scale=1.0
):
    """transformers' signature: the training direction here, the inverse by transformers."""
    if reverse:
        return ORIGINAL(self, inputs, padding_mask, global_conditioning, durations, reverse, noise_scale)
    return duration_nll(self, inputs, padding_mask, global_conditioning, durations)


forward.original = ORIGINAL


def install() -> None:
    """Once per process, at import of model/vits.py."""
    modeling_vits.VitsStochasticDurationPredictor.forward = forward
