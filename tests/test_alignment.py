"""Monotonic alignment search: every backend must give the textbook VITS path bit for bit, ties included."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from vits_trainer.model.alignment import maximum_path, reference_maximum_path

BACKENDS = ("numba", "torch")
GARBAGE = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 0.0])


def _random_batch(gen: torch.Generator, ties: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = int(torch.randint(1, 5, (), generator=gen))
    text_lengths = torch.randint(1, 31, (batch,), generator=gen)
    frame_lengths = torch.stack(
        [torch.randint(int(t), 4 * int(t) + 6, (), generator=gen) for t in text_lengths]
    )
    # Padding beyond the longest item too, so the loops must ignore whole padded rows and columns.
    max_text = int(text_lengths.max()) + int(torch.randint(0, 3, (), generator=gen))
    max_frames = int(frame_lengths.max()) + int(torch.randint(0, 3, (), generator=gen))
    if ties:
        # Integer values from a small set: sums stay exact, so equal-scoring predecessors are common.
        ll = -torch.randint(0, 3, (batch, max_text, max_frames), generator=gen).float()
    else:
        ll = torch.randn(batch, max_text, max_frames, generator=gen) * 5 - 3
    valid = _valid_mask(text_lengths, frame_lengths, max_text, max_frames)
    junk = GARBAGE[torch.randint(0, len(GARBAGE), ll.shape, generator=gen)]
    return torch.where(valid, ll, junk), text_lengths, frame_lengths


def _valid_mask(text_lengths: torch.Tensor, frame_lengths: torch.Tensor, max_text: int, max_frames: int):
    tokens = torch.arange(max_text)[None, :, None] < text_lengths[:, None, None]
    frames = torch.arange(max_frames)[None, None, :] < frame_lengths[:, None, None]
    return tokens & frames


def _check_path(path: torch.Tensor, text_lengths: torch.Tensor, frame_lengths: torch.Tensor) -> None:
    assert path.dtype == torch.float32 and not path.requires_grad
    assert bool(((path == 0) | (path == 1)).all())
    valid = _valid_mask(text_lengths, frame_lengths, path.shape[1], path.shape[2])
    assert not bool(path[~valid].any()), "path outside the valid region"
    for b, (t_x, t_y) in enumerate(zip(text_lengths.tolist(), frame_lengths.tolist(), strict=True)):
        item = path[b, :t_x, :t_y]
        assert bool((item.sum(0) == 1).all()), "each frame must have exactly one token"
        tokens = item.argmax(0)
        steps = tokens[1:] - tokens[:-1]
        assert bool(((steps == 0) | (steps == 1)).all()), "tokens must advance monotonically, one at a time"
        assert int(tokens[0]) == 0 and int(tokens[-1]) == t_x - 1


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_backends_match_reference_on_random_batches(ties: bool) -> None:
    gen = torch.Generator().manual_seed(1234 + ties)
    for _ in range(100):
        ll, text_lengths, frame_lengths = _random_batch(gen, ties)
        expected = reference_maximum_path(ll, text_lengths, frame_lengths)
        _check_path(expected, text_lengths, frame_lengths)
        for backend in BACKENDS:
            got = maximum_path(ll, text_lengths, frame_lengths, backend=backend)
            assert torch.equal(got, expected), (backend, text_lengths.tolist(), frame_lengths.tolist())


def test_ties_stay_on_the_same_token() -> None:
    # All-equal scores: every predecessor comparison is a tie, so the textbook backtrack keeps the last token
    # as long as it can and only steps back when forced onto the diagonal.
    ll = torch.zeros(1, 3, 6)
    expected = torch.tensor([[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    for backend in BACKENDS:
        got = maximum_path(ll, torch.tensor([3]), torch.tensor([6]), backend=backend)
        assert torch.equal(got[0], expected), backend
    assert torch.equal(reference_maximum_path(ll, torch.tensor([3]), torch.tensor([6]))[0], expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_lengths(backend: str) -> None:
    gen = torch.Generator().manual_seed(7)
    ll = torch.randn(4, 9, 9, generator=gen)
    text_lengths = torch.tensor([9, 1, 5, 1])
    frame_lengths = torch.tensor([9, 9, 5, 1])  # square, single token, square shorter, single cell
    got = maximum_path(ll, text_lengths, frame_lengths, backend=backend)
    assert torch.equal(got, reference_maximum_path(ll, text_lengths, frame_lengths))
    _check_path(got, text_lengths, frame_lengths)
    assert torch.equal(got[0], torch.eye(9))
    assert torch.equal(got[1, 0], torch.ones(9)) and not bool(got[1, 1:].any())
    assert torch.equal(got[2, :5, :5], torch.eye(5))
    assert float(got[3].sum()) == 1.0 and float(got[3, 0, 0]) == 1.0


def test_minus_inf_cells_inside_the_valid_region() -> None:
    # Forbidden cells (e.g. masked priors) inside the valid region: still the textbook path, still valid.
    gen = torch.Generator().manual_seed(3)
    ll = torch.randn(3, 12, 40, generator=gen)
    ll[torch.rand(ll.shape, generator=gen) < 0.3] = float("-inf")
    ll[2] = float("-inf")
    text_lengths, frame_lengths = torch.tensor([12, 7, 10]), torch.tensor([40, 20, 33])
    expected = reference_maximum_path(ll, text_lengths, frame_lengths)
    _check_path(expected, text_lengths, frame_lengths)
    for backend in BACKENDS:
        assert torch.equal(maximum_path(ll, text_lengths, frame_lengths, backend=backend), expected), backend


def test_long_very_negative_inputs_need_minus_inf_not_minus_1e9() -> None:
    # Log-likelihoods of -1e7..-1e8 per cell over 600 frames sum to ~-3e10: a -1e9 "impossible" sentinel
    # then scores better than every real path (the classic VITS pitfall). The -inf DP is unaffected.
    gen = torch.Generator().manual_seed(0)
    ll = -(1e7 + 9e7 * torch.rand(2, 150, 600, generator=gen))
    text_lengths, frame_lengths = torch.tensor([150, 100]), torch.tensor([600, 550])
    expected = reference_maximum_path(ll, text_lengths, frame_lengths)
    with_sentinel = reference_maximum_path(ll, text_lengths, frame_lengths, impossible=-1e9)
    for b in range(2):
        assert not torch.equal(expected[b], with_sentinel[b]), "the input must expose the -1e9 pitfall"
    _check_path(expected, text_lengths, frame_lengths)
    for backend in BACKENDS:
        assert torch.equal(maximum_path(ll, text_lengths, frame_lengths, backend=backend), expected), backend


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_are_computed_in_float32(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    ll = (torch.randn(3, 10, 35, generator=gen) * 4).to(dtype)
    text_lengths, frame_lengths = torch.tensor([10, 4, 8]), torch.tensor([35, 12, 30])
    expected = reference_maximum_path(ll.float(), text_lengths, frame_lengths)
    for backend in ("auto", *BACKENDS):
        got = maximum_path(ll, text_lengths, frame_lengths, backend=backend)
        assert got.dtype == torch.float32
        assert torch.equal(got, expected), backend


def test_input_untouched_noncontiguous_and_no_grad() -> None:
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(2, 30, 8, generator=gen)
    ll = base.transpose(1, 2).requires_grad_()  # [2, 8, 30], non-contiguous, part of a graph
    before = ll.detach().clone()
    text_lengths = torch.tensor([8, 5], dtype=torch.int32)
    frame_lengths = torch.tensor([30, 17], dtype=torch.int32)
    expected = reference_maximum_path(before, text_lengths, frame_lengths)
    for backend in ("auto", *BACKENDS):
        got = maximum_path(ll, text_lengths, frame_lengths, backend=backend)
        assert not got.requires_grad and got.device == ll.device
        assert torch.equal(got, expected), backend
        assert torch.equal(ll.detach(), before), "the input must not be modified"


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend: str) -> None:
    empty = torch.empty(0, dtype=torch.long)
    got = maximum_path(torch.zeros(0, 4, 6), empty, empty, backend=backend)
    assert got.shape == (0, 4, 6) and got.dtype == torch.float32


@pytest.mark.parametrize("backend", ("auto", *BACKENDS))
@pytest.mark.parametrize(
    ("text_lengths", "frame_lengths", "message"),
    [
        ([0, 3], [5, 5], "text_len=0"),
        ([4, 3], [3, 5], "frame_len=3"),
        ([3, 3], [5, 9], "T_frames=8"),
        ([7, 3], [8, 5], "T_text=6"),
    ],
)
def test_bad_lengths_raise_on_cpu(
    backend: str, text_lengths: list, frame_lengths: list, message: str
) -> None:
    ll = torch.zeros(2, 6, 8)
    with pytest.raises(ValueError, match=message):
        maximum_path(ll, torch.tensor(text_lengths), torch.tensor(frame_lengths), backend=backend)


def test_bad_arguments_raise() -> None:
    ll, lengths = torch.zeros(2, 4, 6), torch.tensor([2, 3])
    with pytest.raises(ValueError, match="backend"):
        maximum_path(ll, lengths, lengths, backend="cython")
    with pytest.raises(ValueError, match="T_text, T_frames"):
        maximum_path(ll[0], lengths, lengths)
    with pytest.raises(ValueError, match="shape"):
        maximum_path(ll, lengths[:1], lengths)
    with pytest.raises(ValueError, match="integer"):
        maximum_path(ll, lengths.float(), lengths)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
def test_cuda_backends_match_reference(backend: str) -> None:
    gen = torch.Generator().manual_seed(99)
    for ties in (False, True):
        for _ in range(20):
            ll, text_lengths, frame_lengths = _random_batch(gen, ties)
            expected = reference_maximum_path(ll, text_lengths, frame_lengths)
            got = maximum_path(ll.cuda(), text_lengths.cuda(), frame_lengths.cuda(), backend=backend)
            assert got.is_cuda
            assert torch.equal(got.cpu(), expected)
    # long inputs: a wide token block (more warps) and thousands of frames in the kernel's loop
    text_lengths, frame_lengths = torch.tensor([600, 300, 1]), torch.tensor([2400, 1900, 7])
    ll = torch.randn(3, 600, 2400, generator=gen) * 3 - 5
    expected = reference_maximum_path(ll, text_lengths, frame_lengths)
    got = maximum_path(ll.cuda(), text_lengths.cuda(), frame_lengths.cuda(), backend=backend)
    assert torch.equal(got.cpu(), expected)


TRITON_INTERPRETER_CHECK = """
import torch
from tests.test_alignment import _random_batch
from vits_trainer.model.alignment import reference_maximum_path
from vits_trainer.model.alignment_triton import maximum_path_triton
gen = torch.Generator().manual_seed(7)
for ties in (False, True):
    for _ in range(10):
        ll, tx, ty = _random_batch(gen, ties)
        assert torch.equal(maximum_path_triton(ll, tx, ty), reference_maximum_path(ll, tx, ty))
"""


def test_triton_kernel_in_the_interpreter_matches_reference() -> None:
    """The CUDA kernel's logic, run on the CPU by Triton's interpreter (where Triton is installed; CI's
    CPU build of torch has none, so this is skipped there and the CUDA test above checks it on a GPU)."""
    triton = pytest.importorskip("triton")
    import numpy as np

    def major_minor(version: str) -> tuple[int, int]:
        return tuple(int(part) for part in version.split(".")[:2])

    if major_minor(triton.__version__) < (3, 7) and major_minor(np.__version__) >= (2, 4):
        # the interpreter turns a loop bound into an int with int() of a 1-element array, which numpy
        # 2.4 refuses (triton-lang/triton#9171, fixed after 3.6); compiled kernels are not affected
        pytest.skip(f"Triton {triton.__version__}'s interpreter fails under numpy {np.__version__}")
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_INTERPRETER_CHECK], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_triton_is_left_out_where_it_cannot_make_kernels(monkeypatch) -> None:
    """Kaggle's P100 (compute capability 6.0) and a GTX 10xx are older than Triton supports: `auto` takes
    the torch path there, and --compile stays off (compile_choice). The GPU's capability and Triton's
    presence are mocked: this machine has neither a GPU nor Triton (torch's CPU wheel brings none)."""
    import importlib.util

    from vits_trainer.model import alignment, triton_support

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100-PCIE-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 0))
    find_spec = importlib.util.find_spec
    installed = {"triton": True}

    def spec(name, *args):
        if name == "triton":
            return find_spec("torch") if installed["triton"] else None
        return find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", spec)
    problem = triton_support.triton_problem(0)
    assert problem == (
        "the Tesla P100-PCIE-16GB (compute capability 6.0) is older than Triton, the GPU compiler, "
        "supports (7.0 and newer)"
    )
    # the kernel's module imports here as on a GPU machine (a stand-in: without Triton its import
    # fails, and `auto` would leave the kernel out whatever the capability)
    monkeypatch.setitem(sys.modules, "vits_trainer.model.alignment_triton", types.ModuleType("stand-in"))
    alignment._triton_available.cache_clear()
    try:
        assert alignment._triton_available(torch.device("cuda", 0)) is False
        for capability in ((7, 0), (7, 5), (9, 0)):  # V100, T4, H100
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
            assert triton_support.triton_problem(0) is None
            alignment._triton_available.cache_clear()
            assert alignment._triton_available(torch.device("cuda", 0)) is True
    finally:
        alignment._triton_available.cache_clear()
    installed["triton"] = False
    assert triton_support.triton_problem(0) == (
        "Triton, the GPU compiler, is not installed (torch's Linux CUDA wheels bring it)"
    )
