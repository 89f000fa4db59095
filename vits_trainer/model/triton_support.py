"""Whether Triton can make kernels for a CUDA GPU. Two parts of the step use it: the alignment search's
kernel (alignment_triton.py) and the code torch.compile generates (compiled.py)."""

from __future__ import annotations

import importlib.util

import torch

# Triton compiles for compute capability 7.0 (Volta) and newer: not for Kaggle's P100 (6.0) or a GTX 10xx
MIN_CAPABILITY = (7, 0)


def triton_problem(device: torch.device | int | None = None) -> str | None:
    """Why Triton cannot make kernels for this CUDA GPU, in words (None: it can): the GPU is older than
    Triton supports, or Triton is not installed. AMD GPUs (ROCm) number their capability otherwise: only
    the installation is checked there."""
    if torch.version.hip is None:
        capability = tuple(torch.cuda.get_device_capability(device))
        if capability < MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            return (
                f"the {name} (compute capability {capability[0]}.{capability[1]}) is older than Triton, the "
                f"GPU compiler, supports ({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} and newer)"
            )
    if importlib.util.find_spec("triton") is None:
        return "Triton, the GPU compiler, is not installed (torch's Linux CUDA wheels bring it)"
    return None
