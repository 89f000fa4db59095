"""Monotonic alignment search (MAS): the hard text-to-frame alignment VITS trains its duration predictor on.

Every backend reproduces the textbook VITS dynamic programme exactly, ties included (on a tie the path stays
on the same token), with one deliberate difference: "impossible" is -inf, not the original -1e9. With very
negative log-likelihoods over long inputs a -1e9 sentinel beats every real path and silently corrupts the
alignment.

Backends:

* ``"numba"``: compiled CPU path, parallel over the batch. Works column by column (token-major) so it reads
  the [T_text, T_frames] input contiguously, visits only the reachable band of cells and keeps just one
  decision byte per cell instead of the full value matrix.
* ``"triton"``: the CUDA path (`alignment_triton.py`): one kernel launch for the whole batch, one program
  per item looping over its frames on the GPU; nothing goes to the host.
* ``"torch"``: batched torch ops on the input's own device (CUDA without Triton, or any other device). A
  Python loop over frames, with three vectorised kernels per frame in the forward pass and two in the
  backtrack: bound by kernel-launch latency on a GPU.

All compute ``value = log_likelihood + max(from previous token, from same token)`` in float32 with the same
single rounding per cell, so their paths are bit-identical to :func:`reference_maximum_path`.
"""

from __future__ import annotations

import functools
import threading

import numba
import numpy as np
import torch

from .triton_support import triton_problem

__all__ = ["maximum_path", "reference_maximum_path"]

_BACKENDS = ("auto", "numba", "torch", "triton")
# numba's fallback threading layer (workqueue, used when neither TBB nor OpenMP loads) aborts the process
# on concurrent parallel launches from several Python threads; serialising costs nothing in one training thread.
_NUMBA_LOCK = threading.Lock()


@torch.no_grad()
def maximum_path(
    log_likelihood: torch.Tensor,
    text_lengths: torch.Tensor,
    frame_lengths: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Most likely monotonic alignment of frames to text tokens.

    Args:
        log_likelihood: [B, T_text, T_frames], the log-likelihood of each frame under each token's prior.
            Any float dtype (computed in float32). Cells beyond the lengths are ignored, whatever they hold.
            Valid cells are expected to be finite or -inf (NaN there gives an unspecified path).
        text_lengths: [B] integer token counts, 1 <= text_len <= frame_len.
        frame_lengths: [B] integer frame counts, frame_len <= T_frames.
        backend: "auto" (numba on the CPU, triton on a CUDA GPU Triton supports, else torch), "numba",
            "torch" or "triton" (CUDA only).

    Returns:
        [B, T_text, T_frames] float32 0/1 path on the input's device; zero outside the valid region. Each
        valid frame has exactly one token, tokens advance by at most one per frame, every token gets a frame,
        the first frame is token 0 and the last frame is token text_len - 1.

    Lengths are validated (ValueError) whenever they are on the CPU; CUDA lengths are not checked, because
    that would cost a host sync (bad CUDA lengths give a garbage path, never an out-of-bounds access).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"unknown MAS backend {backend!r}; expected one of {', '.join(_BACKENDS)}")
    if log_likelihood.dim() != 3:
        raise ValueError(
            f"log_likelihood must be [B, T_text, T_frames], got shape {tuple(log_likelihood.shape)}"
        )
    if not log_likelihood.is_floating_point():
        raise ValueError(f"log_likelihood must be a float tensor, got {log_likelihood.dtype}")
    batch = log_likelihood.shape[0]
    for name, lengths in (("text_lengths", text_lengths), ("frame_lengths", frame_lengths)):
        if lengths.shape != (batch,):
            raise ValueError(f"{name} must have shape ({batch},), got {tuple(lengths.shape)}")
        if lengths.is_floating_point() or lengths.is_complex():
            raise ValueError(f"{name} must be an integer tensor, got {lengths.dtype}")

    if backend == "auto":
        if log_likelihood.device.type == "cpu":
            backend = "numba"
        else:
            backend = (
                "triton" if log_likelihood.is_cuda and _triton_available(log_likelihood.device) else "torch"
            )
    # The numba path copies to the host anyway, so checking costs nothing there.
    if backend == "numba" or (text_lengths.device.type == "cpu" and frame_lengths.device.type == "cpu"):
        _validate_lengths(log_likelihood.shape, text_lengths.cpu(), frame_lengths.cpu())

    if batch == 0:
        return torch.zeros(log_likelihood.shape, dtype=torch.float32, device=log_likelihood.device)
    if backend == "numba":
        return _maximum_path_numba(log_likelihood, text_lengths, frame_lengths)
    if backend == "triton":
        from .alignment_triton import maximum_path_triton

        return maximum_path_triton(log_likelihood, text_lengths, frame_lengths)
    return _maximum_path_torch(log_likelihood, text_lengths, frame_lengths)


@functools.cache
def _triton_available(device: torch.device) -> bool:
    """Triton comes with PyTorch's CUDA builds, and makes kernels for GPUs of compute capability 7.0 and
    newer (triton_support.py); checked once per device."""
    if triton_problem(device) is not None:
        return False
    try:
        from . import alignment_triton  # noqa: F401
    except ImportError:
        return False
    return True


def _validate_lengths(shape: torch.Size, text_lengths: torch.Tensor, frame_lengths: torch.Tensor) -> None:
    _, max_text, max_frames = shape
    problems = []
    for b, (t_x, t_y) in enumerate(zip(text_lengths.tolist(), frame_lengths.tolist(), strict=True)):
        if not 1 <= t_x <= max_text:
            problems.append(f"item {b}: text_len={t_x} not in [1, T_text={max_text}]")
        elif not t_x <= t_y <= max_frames:
            problems.append(f"item {b}: frame_len={t_y} not in [text_len={t_x}, T_frames={max_frames}]")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(
            "monotonic alignment needs 1 <= text_len <= frame_len for every item: "
            + "; ".join(problems[:3])
            + more
        )


# ----------------------------------------------------------------------------------------------------------
# numba backend


@numba.njit(cache=True, nogil=True)
def _mas_one(ll: np.ndarray, t_x: int, t_y: int, path: np.ndarray) -> None:
    """One item: ll [T_text, T_frames] float32 (read only), path [T_text, T_frames] float32 zeros (written)."""
    neg_inf = np.float32(-np.inf)
    zero = np.float32(0.0)
    band = t_y - t_x + 1  # token x is reachable at frames x .. x + band - 1
    # came_from_prev[x, y - x]: the backtrack moves from token x to x - 1 when leaving frame y.
    came_from_prev = np.zeros((t_x, band), dtype=np.uint8)
    prev_col = np.empty(t_y, dtype=np.float32)  # value[:, x - 1], indexed by frame
    cur_col = np.empty(t_y, dtype=np.float32)
    for x in range(t_x):
        v_cur = neg_inf  # textbook: the same-token predecessor is impossible when x == y
        for y in range(x, x + band):
            if x == 0:
                v_prev = zero if y == 0 else neg_inf
            else:
                v_prev = prev_col[y - 1]
            # Same max as the textbook (first argument unless the second is larger); x == y forces the step.
            best = v_cur if v_cur > v_prev else v_prev
            came_from_prev[x, y - x] = x > 0 and (y == x or v_cur < v_prev)
            v_cur = ll[x, y] + best  # float32 + float32: one rounding, as in the reference
            cur_col[y] = v_cur
        prev_col, cur_col = cur_col, prev_col
    index = t_x - 1
    for y in range(t_y - 1, -1, -1):
        path[index, y] = 1.0
        if index != 0 and came_from_prev[index, y - index]:
            index -= 1


@numba.njit(parallel=True, cache=True, nogil=True)
def _mas_batch(ll: np.ndarray, text_lengths: np.ndarray, frame_lengths: np.ndarray, path: np.ndarray) -> None:
    for b in numba.prange(ll.shape[0]):
        _mas_one(ll[b], text_lengths[b], frame_lengths[b], path[b])


def _maximum_path_numba(
    log_likelihood: torch.Tensor, text_lengths: torch.Tensor, frame_lengths: torch.Tensor
) -> torch.Tensor:
    # Contiguous float32 keeps a single compiled specialisation; the input is only read, so a view is fine.
    ll = log_likelihood.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    t_x = text_lengths.detach().cpu().numpy().astype(np.int64)
    t_y = frame_lengths.detach().cpu().numpy().astype(np.int64)
    path = np.zeros(ll.shape, dtype=np.float32)
    with _NUMBA_LOCK:
        _mas_batch(ll, t_x, t_y, path)
    return torch.from_numpy(path).to(log_likelihood.device)


# ----------------------------------------------------------------------------------------------------------
# torch backend


def _maximum_path_torch(
    log_likelihood: torch.Tensor, text_lengths: torch.Tensor, frame_lengths: torch.Tensor
) -> torch.Tensor:
    batch, max_text, max_frames = log_likelihood.shape
    device = log_likelihood.device
    t_x = text_lengths.to(device=device, dtype=torch.long, non_blocking=True)
    t_y = frame_lengths.to(device=device, dtype=torch.long, non_blocking=True)

    # Frame-major copy (one kernel, dtype conversion included) so each step reads a contiguous [B, T_text]
    # slab; on the CPU this transpose costs less than the per-frame strided reads it replaces.
    ll = torch.empty((max_frames, batch, max_text), dtype=torch.float32, device=device)
    ll.copy_(log_likelihood.detach().permute(2, 0, 1))
    ll_frames = ll.unbind(0)
    # Two ping-pong rows of values over tokens, shifted by one: column 0 is a permanent -inf standing for
    # "token -1", so the previous-token predecessors are a view, not a copy. Tokens not yet reachable hold
    # -inf, which is exactly the textbook's impossible same-token predecessor on the diagonal x == y.
    rows = torch.full((2, batch, max_text + 1), float("-inf"), dtype=torch.float32, device=device)
    rows[0, :, 1] = ll_frames[0][:, 0]  # frame 0: only token 0, with predecessor value 0
    from_prev = [rows[k, :, :-1] for k in range(2)]
    from_same = [rows[k, :, 1:] for k in range(2)]
    # came_from_prev[y, b, x]: the backtrack moves from token x to x - 1 when leaving frame y. Written as
    # bool (no cast per frame) and read through a uint8 view so it can be subtracted from token indices.
    came_from_prev = torch.empty((max_frames, batch, max_text), dtype=torch.bool, device=device)
    came_from_prev[0] = False  # every later frame is fully written by the forward pass
    dec_frames = came_from_prev.unbind(0)

    # Cells outside the reachable band (or in padding) are computed too, but no in-band cell ever reads
    # them and the ops are elementwise, so garbage there (NaN included) cannot leak into the path.
    for y in range(1, max_frames):
        src, dst = (y - 1) % 2, y % 2
        torch.gt(from_prev[src], from_same[src], out=dec_frames[y])
        torch.maximum(from_prev[src], from_same[src], out=from_same[dst])
        from_same[dst].add_(ll_frames[y])

    # The textbook always steps back on the diagonal (even when both predecessors are -inf) and never moves
    # in padded frames, so the backtrack can start from the last padded frame for every item alike.
    came_from_prev.diagonal(dim1=0, dim2=2).fill_(True)
    frames = torch.arange(max_frames, device=device)
    valid_frames = frames[:, None] < t_y[None, :]  # [T_frames, B]
    came_from_prev &= valid_frames[:, :, None]
    step_frames = came_from_prev.view(torch.uint8).unbind(0)

    token_of_frame = torch.empty((max_frames, batch, 1), dtype=torch.long, device=device)
    # Clamped so bad (unvalidated CUDA) lengths cannot index out of bounds.
    token_of_frame[-1, :, 0] = (t_x - 1).clamp_(0, max_text - 1)
    idx_frames = token_of_frame.unbind(0)
    for y in range(max_frames - 1, 0, -1):
        torch.sub(idx_frames[y], step_frames[y].gather(1, idx_frames[y]), out=idx_frames[y - 1])

    path = torch.zeros((batch, max_text, max_frames), dtype=torch.float32, device=device)
    # Padded frames scatter a 0 (onto token text_len - 1), leaving them empty.
    return path.scatter_(1, token_of_frame.permute(1, 2, 0), valid_frames.T[:, None, :].to(torch.float32))


# ----------------------------------------------------------------------------------------------------------
# reference


def reference_maximum_path(
    log_likelihood: torch.Tensor,
    text_lengths: torch.Tensor,
    frame_lengths: torch.Tensor,
    *,
    impossible: float = float("-inf"),
) -> torch.Tensor:
    """The textbook VITS dynamic programme as plain Python loops over float32 numpy arrays (slow).

    For tests and benchmarks only. ``impossible`` exists to reproduce the original -1e9 sentinel's failure.
    """
    ll_all = log_likelihood.detach().to(device="cpu", dtype=torch.float32).numpy()
    path_all = np.zeros(ll_all.shape, dtype=np.float32)
    neg = np.float32(impossible)
    zero = np.float32(0.0)
    for b in range(ll_all.shape[0]):
        t_x, t_y = int(text_lengths[b]), int(frame_lengths[b])
        value = ll_all[b, :t_x, :t_y].T.copy()  # [t_y, t_x]: value[y, x], y = frame, x = token
        for y in range(t_y):
            for x in range(max(0, t_x + y - t_y), min(t_x, y + 1)):
                v_cur = neg if x == y else value[y - 1, x]
                if x == 0:
                    v_prev = zero if y == 0 else neg
                else:
                    v_prev = value[y - 1, x - 1]
                value[y, x] += max(v_prev, v_cur)
        index = t_x - 1
        for y in range(t_y - 1, -1, -1):
            path_all[b, index, y] = 1.0
            if index != 0 and (index == y or value[y - 1, index] < value[y - 1, index - 1]):
                index -= 1
    return torch.from_numpy(path_all).to(log_likelihood.device)
