"""Initialise a freshly built VitsModel the way VITS itself does, not the way transformers does.

Why: transformers' `VitsPreTrainedModel._init_weights` draws every plain convolution from a Kaiming
normal (2-2.5x the spread of torch's default) and leaves the flows' last convolutions random. On an
MMS-size model that puts the posterior's log-std at about +-9 and the KL at ~257,600 on the first
step (`bench/probe_fp16.py`): its gradients overflow fp16 at any loss scale, so an fp16 run from
scratch fell back to bf16/fp32. The VITS recipe (Kim et al., 2021, reference implementation) starts
the flows as identities and the decoder small:
- every convolution: torch's default initialisation;
- the HiFi-GAN decoder's upsampling and residual-block convolutions: normal(0, 0.01);
- each residual coupling layer's output convolution (`flow.flows[i].conv_post`): zero, so the
  normalising flow starts as the identity;
- each spline flow's projection in the stochastic duration predictor (`conv_proj`): zero.
Only for models this tool creates (the demo, tests, benchmarks); a checkpoint being fine-tuned keeps
its trained weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize


@torch.no_grad()
def init_like_vits(model) -> None:
    """Re-initialise a fresh `VitsModel` in place (see the module docstring)."""
    for module in model.modules():
        # weight-normed convolutions (the WaveNet layers) already got torch's default when transformers
        # built them: its initialiser cannot reach through the parametrisation
        if isinstance(module, nn.Conv1d | nn.ConvTranspose1d) and not parametrize.is_parametrized(module):
            module.reset_parameters()
    decoder = model.decoder
    for module in [*decoder.upsampler, *decoder.resblocks]:
        for conv in module.modules():
            if isinstance(conv, nn.Conv1d | nn.ConvTranspose1d):
                nn.init.normal_(conv.weight, 0.0, 0.01)
    for layer in model.flow.flows:
        if hasattr(layer, "conv_post"):
            nn.init.zeros_(layer.conv_post.weight)
            nn.init.zeros_(layer.conv_post.bias)
    predictor = model.duration_predictor
    for flows in (getattr(predictor, "flows", []), getattr(predictor, "post_flows", [])):
        for flow in flows:
            if hasattr(flow, "conv_proj"):
                nn.init.zeros_(flow.conv_proj.weight)
                nn.init.zeros_(flow.conv_proj.bias)
