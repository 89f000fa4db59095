"""model/wavenet.py: the posterior encoder's and flow's WaveNet layers give transformers' outputs and
gradients with fewer operators, no read of a tensor, and one graph for torch.compile."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import VitsModel
from transformers.models.vits import modeling_vits

import vits_trainer.model.vits  # noqa: F401  (installs the WaveNet forward)
from vits_trainer.model.tiny import tiny_config
from vits_trainer.model.wavenet import ORIGINAL, wavenet_forward


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _model(num_speakers: int) -> VitsModel:
    torch.manual_seed(0)
    model = VitsModel(tiny_config(30, num_speakers=num_speakers, wavenet_dropout=0.0))
    return model.train()


def _inputs(model: VitsModel, num_speakers: int, frames: int = 50):
    g = torch.Generator().manual_seed(1)
    spec = torch.randn(3, model.config.spectrogram_bins, frames, generator=g)
    lengths = torch.tensor([frames, frames - 7, frames - 20])
    mask = (torch.arange(frames)[None] < lengths[:, None]).unsqueeze(1).float()
    cond = torch.randn(3, model.config.speaker_embedding_size, 1, generator=g) if num_speakers > 1 else None
    return spec, mask, cond


def _posterior_and_flow(model, spec, mask, cond, forward, ops=None):
    """The posterior encoder then the flow (both run WaveNet stacks) with `forward` as the WaveNet's
    forward; returns the outputs and every parameter's gradient."""
    saved = modeling_vits.VitsWaveNet.forward
    modeling_vits.VitsWaveNet.forward = forward
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(2)  # the posterior's sampling noise
        with ops if ops is not None else contextlib.nullcontext():
            z, mean, logs = model.posterior_encoder(spec, mask, cond)
            z_p = model.flow(z, mask, cond)
            (z_p.sin().sum() + logs.square().sum()).backward()
    finally:
        modeling_vits.VitsWaveNet.forward = saved
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return (z.detach(), mean.detach(), logs.detach(), z_p.detach()), grads


@pytest.mark.parametrize("num_speakers", [1, 3])
def test_same_outputs_and_gradients_as_transformers(num_speakers):
    model = _model(num_speakers)
    args = _inputs(model, num_speakers)
    ours, our_grads = _posterior_and_flow(model, *args, wavenet_forward)
    theirs, their_grads = _posterior_and_flow(model, *args, ORIGINAL)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert our_grads.keys() == their_grads.keys() and len(our_grads) > 10
    for name in our_grads:
        torch.testing.assert_close(our_grads[name], their_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_fewer_operators_and_no_tensor_read():
    """Per layer transformers builds a CPU tensor and reads it for each of two slices
    (`_local_scalar_dense`), and adds zeros."""
    model = _model(1)
    args = _inputs(model, 1)
    counts = {}
    for label, forward in (("ours", wavenet_forward), ("theirs", ORIGINAL)):
        ops = _Ops()
        _posterior_and_flow(model, *args, forward, ops=ops)
        counts[label] = ops.names
    layers = sum(m.num_layers for m in model.modules() if isinstance(m, modeling_vits.VitsWaveNet))
    assert "_local_scalar_dense" not in counts["ours"]
    assert counts["theirs"].count("_local_scalar_dense") == 2 * layers  # both slices read it
    # at least the zeros and their add per layer, forward only
    assert len(counts["ours"]) <= len(counts["theirs"]) - 2 * layers, (
        len(counts["ours"]),
        len(counts["theirs"]),
    )


def test_transformers_uses_it_and_the_compiler_sees_one_graph():
    assert modeling_vits.VitsWaveNet.forward is wavenet_forward
    model = _model(1)
    spec, mask, _ = _inputs(model, 1)
    explained = torch._dynamo.explain(model.posterior_encoder)(spec, mask, None)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
