"""The layer stack of transformers' text encoder (`VitsEncoder`), with LayerDrop that compiles.

In training, transformers skips each encoder layer with probability `config.layerdrop` (0.1 in MMS
configs), deciding per layer with `np.random.uniform` and a Python `if`. `torch.compile` cannot trace a
branch on a random number: it breaks the graph there, and as the break is inside the layer loop it gives
up on the whole stack, which then runs eager with each layer compiled apart. Here every layer's
keep-or-skip is drawn at once on the device and applied with `torch.where`: the same distribution (a
layer is skipped with probability `layerdrop`, then passes its input on unchanged and gets no
gradient), no host read, one graph. A skipped layer is still computed and its output discarded:
`layerdrop` of the stack's work, which a launch-bound GPU step does not notice. As every layer's
weights get a gradient (zero when skipped), DDP needs no search for unused parameters.

Outside training or with `layerdrop` 0 every layer runs, as in transformers (whose loop draws its random
number and breaks the graph even then). When attentions or hidden states are asked for, transformers'
own forward runs. `install()` makes transformers' module use this one.
"""

from __future__ import annotations

import torch
from transformers.models.vits import modeling_vits

ORIGINAL = getattr(modeling_vits.VitsEncoder.forward, "original", None) or modeling_vits.VitsEncoder.forward


def encoder_forward(
    self,
    hidden_states: torch.Tensor,
    padding_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    output_attentions: bool | None = None,
    output_hidden_states: bool | None = None,
    return_dict: bool | None = None,
):
    if output_attentions or output_hidden_states:
        return ORIGINAL(
            self,
            hidden_states,
            padding_mask,
            attention_mask,
            output_attentions,
            output_hidden_states,
            return_dict,
        )
    attention_mask = modeling_vits.create_bidirectional_mask(
        config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
    )
    hidden_states = hidden_states * padding_mask
    keep = None  # every layer runs
    if self.training and self.layerdrop > 0:
        keep = torch.rand(len(self.layers), device=hidden_states.device) >= self.layerdrop
    for i, layer in enumerate(self.layers):
        out = layer(hidden_states, attention_mask=attention_mask, padding_mask=padding_mask)[0]
        hidden_states = out if keep is None else torch.where(keep[i], out, hidden_states)
    hidden_states = hidden_states * padding_mask
    if not return_dict:
        return (hidden_states,)
    return modeling_vits.BaseModelOutput(last_hidden_state=hidden_states)


encoder_forward.original = ORIGINAL


def install() -> None:
    """Once per process, at import of model/vits.py."""
    modeling_vits.VitsEncoder.forward = encoder_forward
