"""The WaveNet stack of transformers' posterior encoder and flow, without its two detours.

Every layer of transformers' `VitsWaveNet.forward` (16 in the MMS posterior encoder, 4 in each of its
4 flows) does two things its arithmetic does not need:
- it slices the gated activations by a one-element CPU tensor (`torch.IntTensor([hidden_size])[0]`):
  an operator and a read of that tensor per layer, and a graph break for `torch.compile`, which
  cannot trace a slice bound read from a tensor;
- without speaker conditioning it adds a tensor of zeros (`torch.zeros_like`): two more operators per
  layer, forward and backward.
`wavenet_forward` is the same layer stack slicing by the Python int and adding the conditioning only
where there is one: the same outputs and gradients (`tests/test_wavenet.py`), fewer operators, and one
graph for the compiler. `install()` makes transformers' modules use it.
"""

from __future__ import annotations

import torch
from transformers.models.vits import modeling_vits

ORIGINAL = getattr(modeling_vits.VitsWaveNet.forward, "original", None) or modeling_vits.VitsWaveNet.forward


def wavenet_forward(self, inputs, padding_mask, global_conditioning=None):
    hidden = self.hidden_size
    if global_conditioning is not None:
        global_conditioning = self.cond_layer(global_conditioning)
    outputs = None
    for i in range(self.num_layers):
        in_act = self.in_layers[i](inputs)
        if global_conditioning is not None:
            in_act = in_act + global_conditioning[:, i * 2 * hidden : (i + 1) * 2 * hidden, :]
        acts = self.dropout(torch.tanh(in_act[:, :hidden, :]) * torch.sigmoid(in_act[:, hidden:, :]))
        res_skip = self.res_skip_layers[i](acts)
        skip = res_skip[:, hidden:, :] if i < self.num_layers - 1 else res_skip
        outputs = skip if outputs is None else outputs + skip
        if i < self.num_layers - 1:
            inputs = (inputs + res_skip[:, :hidden, :]) * padding_mask
    if outputs is None:  # no layers: transformers returns zeros
        outputs = torch.zeros_like(inputs)
    return outputs * padding_mask


wavenet_forward.original = ORIGINAL


def install() -> None:
    """Once per process, at import of model/vits.py."""
    modeling_vits.VitsWaveNet.forward = wavenet_forward
