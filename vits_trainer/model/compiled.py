"""torch.compile for the fixed-shape part of a training step.

The decoder runs on `segment_frames`-frame slices and the discriminator on [real; fake] slices of
`segment_size` samples: their shapes depend only on the micro-batch size, so they compile once per
size and, on a GPU, are replayed as CUDA graphs (`mode="reduce-overhead"`): thousands of small kernel
launches by the host become one graph launch each. The encoders, the flow and the alignment search
see each batch's own lengths and stay eager.

Shapes are static (`dynamic=False`): a new micro-batch size (an epoch's short last step, an
out-of-memory retry) compiles its own graph rather than a slower dynamic one.
"""

from __future__ import annotations

import torch

BACKEND = "inductor"  # torch's default compiler; the CPU tests use "aot_eager" (capture without codegen)


def compile_mode(device_type: str) -> str:
    """CUDA graphs where there is a GPU; plain kernel fusion elsewhere."""
    return "reduce-overhead" if device_type == "cuda" else "default"


def compiled(module: torch.nn.Module, device_type: str, backend: str | None = None):
    """`module` compiled for the training step. The returned wrapper is an `nn.Module`: keep it out of
    other modules' attributes, or it is registered (and saved) as their submodule."""
    backend = backend or BACKEND
    mode = compile_mode(device_type) if backend == "inductor" else None
    return torch.compile(module, backend=backend, mode=mode, dynamic=False)


def mark_step_begin(device_type: str) -> None:
    """Tell CUDA graphs a new step begins: the outputs of the previous one may be overwritten."""
    if device_type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
