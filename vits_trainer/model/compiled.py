"""torch.compile for a training step: the model's parts and the discriminator, CUDA graphs on a GPU.

On a GPU the eager step is limited by the host launching thousands of small kernels, not by the GPU's
arithmetic. Compiled, a part's small operators are fused into fewer kernels, launched without Python
and autograd bookkeeping per operator, and where shapes are fixed replayed as CUDA graphs
(`mode="reduce-overhead"`): one launch per graph. The alignment search, the losses and the
spectrograms stay eager between them.

Two kinds of shapes:
- SEGMENT_PARTS (the decoder on `segment_frames`-frame slices) and the discriminator ([real; fake]
  slices of `segment_size` samples) see shapes that depend only on the micro-batch size: static
  (`dynamic=False`) and CUDA graphs; a new micro-batch size (an epoch's short last step, an
  out-of-memory retry) compiles its own graph rather than a slower dynamic one.
- UTTERANCE_PARTS (text encoder, posterior encoder, flow, duration predictor) see each batch's padded
  text and frame lengths: compiled once with symbolic shapes (`dynamic=True`), so no later batch
  compiles again, whatever its lengths or size (a compile in the middle of training would cost
  seconds to minutes, and the loop's measurement of the compiled step would time it as a step).
  Their kernels are fused but not captured as CUDA graphs
  (UTTERANCE_GRAPHS): a graph would be recorded, and its memory held, for each new shape in the middle
  of training (length buckets, data/shapes.py, bring that to ~100 shapes per epoch, not one).
`python bench/bench_compile.py --scopes segments,fused,graphs` measures the three choices.
"""

from __future__ import annotations

import torch

BACKEND = "inductor"  # torch's default compiler; the CPU tests use "aot_eager" (capture without codegen)
SEGMENT_PARTS = ("decoder",)
UTTERANCE_PARTS = ("text_encoder", "posterior_encoder", "flow", "duration_predictor")
UTTERANCE_GRAPHS = False  # CUDA graphs for the utterance parts too (one per shape), see above


def compile_mode(device_type: str, graphs: bool = True) -> str:
    """CUDA graphs where there is a GPU (and `graphs`); plain kernel fusion elsewhere."""
    return "reduce-overhead" if device_type == "cuda" and graphs else "default"


def compiled(
    module: torch.nn.Module,
    device_type: str,
    backend: str | None = None,
    dynamic: bool | None = False,
    graphs: bool = True,
):
    """`module` compiled for the training step (`dynamic`: as torch.compile's; `graphs`: CUDA graphs on
    a GPU). The returned wrapper is an `nn.Module`: keep it out of other modules' attributes, or it is
    registered (and saved) as their submodule."""
    backend = backend or BACKEND
    mode = compile_mode(device_type, graphs) if backend == "inductor" else None
    return torch.compile(module, backend=backend, mode=mode, dynamic=dynamic)


def compiled_parts(
    model: torch.nn.Module,
    device_type: str,
    backend: str | None = None,
    utterance_graphs: bool | None = None,
) -> dict:
    """Every part of a `VitsModel` the training forward runs, compiled, by attribute name
    (`utterance_graphs`: None for UTTERANCE_GRAPHS)."""
    graphs = UTTERANCE_GRAPHS if utterance_graphs is None else utterance_graphs
    parts = {name: compiled(getattr(model, name), device_type, backend) for name in SEGMENT_PARTS}
    for name in UTTERANCE_PARTS:
        parts[name] = compiled(getattr(model, name), device_type, backend, dynamic=True, graphs=graphs)
    return parts


def mark_step_begin(device_type: str) -> None:
    """Tell CUDA graphs a new step begins: the outputs of the previous one may be overwritten."""
    if device_type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
