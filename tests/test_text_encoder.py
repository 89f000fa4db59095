"""model/text_encoder.py: the text encoder's LayerDrop decided on the device gives transformers' outputs
and gradients for the same decisions, skips layers as often, and leaves torch.compile one graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import VitsModel
from transformers.models.vits import modeling_vits

import vits_trainer.model.vits  # noqa: F401  (installs the encoder forward)
from vits_trainer.model.text_encoder import ORIGINAL, encoder_forward
from vits_trainer.model.tiny import tiny_config

LAYERS = 4


def _model(layerdrop: float) -> VitsModel:
    torch.manual_seed(0)
    config = tiny_config(30, num_hidden_layers=LAYERS, layerdrop=layerdrop, hidden_dropout=0.0)
    config.attention_dropout = config.activation_dropout = 0.0
    return VitsModel(config).train()


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 30, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return ids, mask


def _encode(model, ids, mask, forward):
    """The text encoder with `forward` as its layer stack's; its output and every gradient."""
    saved = modeling_vits.VitsEncoder.forward
    modeling_vits.VitsEncoder.forward = forward
    try:
        model.zero_grad(set_to_none=True)
        out = model.text_encoder(input_ids=ids, padding_mask=mask.unsqueeze(-1).float(), attention_mask=mask)
        out.last_hidden_state.sin().sum().backward()
    finally:
        modeling_vits.VitsEncoder.forward = saved
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.last_hidden_state.detach(), grads


def _draws_skipping(skipped: set[int], layerdrop: float):
    """np.random.uniform as transformers' loop calls it, once per layer: layers in `skipped` drop."""
    calls = iter(range(LAYERS))
    return lambda *args: 0.0 if next(calls) in skipped else max(layerdrop, 0.5)


@pytest.mark.parametrize("layerdrop", [0.0, 0.5])
def test_same_outputs_and_gradients_as_transformers_for_the_same_layers(layerdrop, monkeypatch):
    model = _model(layerdrop)
    ids, mask = _inputs()
    torch.manual_seed(5)
    keep = (torch.rand(LAYERS) >= layerdrop).tolist()  # what encoder_forward draws after that seed
    skipped = {i for i, k in enumerate(keep) if not k}
    if layerdrop:
        assert 0 < len(skipped) < LAYERS, keep  # both kinds of layer in this comparison
    torch.manual_seed(5)
    ours, our_grads = _encode(model, ids, mask, encoder_forward)
    monkeypatch.setattr(np.random, "uniform", _draws_skipping(skipped, layerdrop))
    theirs, their_grads = _encode(model, ids, mask, ORIGINAL)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    # a skipped layer's parameters get zero gradients here, none at all from transformers
    for name, grad in our_grads.items():
        expected = their_grads.get(name, torch.zeros_like(grad))
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
    assert their_grads.keys() <= our_grads.keys()
    # every weight gets a gradient, zero when its layer was skipped: DDP need not search for unused ones
    layers = model.text_encoder.encoder.named_parameters(prefix="text_encoder.encoder")
    assert {n for n, _ in layers} <= our_grads.keys()
    dropped = [n for n in our_grads if any(f"encoder.layers.{i}." in n for i in skipped)]
    assert all(not our_grads[n].any() for n in dropped) and (bool(dropped) == bool(skipped))


def test_layers_are_skipped_with_probability_layerdrop_and_never_outside_training():
    model = _model(0.25)
    ids, mask = _inputs()
    identical = 0
    with torch.no_grad():
        plain = (
            model.eval()
            .text_encoder(input_ids=ids, padding_mask=mask.unsqueeze(-1).float())
            .last_hidden_state
        )
        model.train()
        torch.manual_seed(0)
        for _ in range(400):
            out = model.text_encoder(input_ids=ids, padding_mask=mask.unsqueeze(-1).float()).last_hidden_state
            identical += torch.equal(out, plain)
    # the same output as in evaluation exactly when no layer was dropped: 0.75 ** 4 = 0.32 of the time
    assert identical == pytest.approx(400 * 0.75**LAYERS, abs=40)


def test_transformers_uses_it_and_the_compiler_sees_one_graph():
    """transformers' own loop breaks the graph on its np.random draw (even with layerdrop 0), then gives
    up on the whole stack: a graph break in a loop."""
    assert modeling_vits.VitsEncoder.forward is encoder_forward
    model = _model(0.1)
    ids, mask = _inputs()
    explained = torch._dynamo.explain(model.text_encoder)(
        input_ids=ids, padding_mask=mask.unsqueeze(-1).float(), attention_mask=mask
    )
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
    assert explained.graph_count == 1
