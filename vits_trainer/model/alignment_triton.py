"""The CUDA alignment search as one Triton kernel: one program per batch item, the frame loop inside it.

The batched torch path launches a few small kernels per frame, so on a GPU it is bound by launch latency
(bench/bench_mas.py; figures in docs/performance.md). Here each program
walks its item's frames in a loop, all tokens of a frame at once, and then backtracks, all in one launch.
Same arithmetic as the other backends (value = log_likelihood + max(from previous token, from same
token), float32, one rounding, ties stay on the same token), so the path is bit-identical to the
reference.

Triton ships with the CUDA builds of PyTorch; without it (or on the CPU) `alignment.py` uses its other
backends. Only `alignment.py` imports this module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mas_kernel(
    ll_ptr,  # [B, T_frames, T_text] float32, frame-major so a frame's tokens are contiguous
    tx_ptr,  # [B] int32 text lengths
    ty_ptr,  # [B] int32 frame lengths
    rows_ptr,  # [B, 2, BLOCK + 1] float32 scratch, column 0 = -inf ("token -1"); two ping-pong rows
    dec_ptr,  # [B, T_frames, BLOCK] int8: 1 where the best predecessor is the previous token
    path_ptr,  # [B, T_text, T_frames] float32 zeros, 1.0 written along the path
    T_TEXT,
    T_FRAMES,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    # lengths are clamped so bad (unvalidated CUDA) input can never index out of bounds
    t_x = tl.minimum(tl.maximum(tl.load(tx_ptr + b), 1), T_TEXT)
    t_y = tl.minimum(tl.maximum(tl.load(ty_ptr + b), 1), T_FRAMES)
    x = tl.arange(0, BLOCK)
    tokens = x < t_x
    ll_b = ll_ptr + b * T_FRAMES * T_TEXT
    rows_b = rows_ptr + b * 2 * (BLOCK + 1)
    dec_b = dec_ptr + b * T_FRAMES * BLOCK
    neg_inf = float("-inf")

    # frame 0: only token 0 is reachable (its predecessor value is 0)
    first = tl.load(ll_b + x, mask=x == 0, other=neg_inf)
    value = tl.where(x == 0, first, neg_inf)
    tl.store(rows_b + 1 + x, value)
    tl.debug_barrier()
    for y in range(1, t_y):
        # value[x - 1] of the previous frame, written by the neighbouring lane: read it from the row
        prev = tl.load(rows_b + ((y - 1) % 2) * (BLOCK + 1) + x)
        step = prev > value  # a tie stays on the same token, as in the textbook
        best = tl.maximum(prev, value)
        value = tl.load(ll_b + y * T_TEXT + x, mask=tokens, other=neg_inf) + best
        tl.store(dec_b + y * BLOCK + x, step.to(tl.int8))
        tl.store(rows_b + (y % 2) * (BLOCK + 1) + 1 + x, value)
        # one barrier per frame: this frame's row is complete before the next frame reads it, and
        # the row being overwritten next frame was last read before this barrier
        tl.debug_barrier()

    # backtrack from the last token at the last frame; on the diagonal (token == frame) it must step
    path_b = path_ptr + b * T_TEXT * T_FRAMES
    index = t_x - 1
    for k in range(0, t_y - 1):
        y = t_y - 1 - k
        tl.store(path_b + index * T_FRAMES + y, 1.0)
        move = tl.load(dec_b + y * BLOCK + index) != 0
        move = (move | (index == y)) & (index > 0)
        index = index - move.to(index.dtype)
    tl.store(path_b + index * T_FRAMES, 1.0)


def maximum_path_triton(
    log_likelihood: torch.Tensor, text_lengths: torch.Tensor, frame_lengths: torch.Tensor
) -> torch.Tensor:
    batch, max_text, max_frames = log_likelihood.shape
    device = log_likelihood.device
    block = triton.next_power_of_2(max_text)
    ll = torch.empty((batch, max_frames, max_text), dtype=torch.float32, device=device)
    ll.copy_(log_likelihood.detach().transpose(1, 2))  # one kernel, dtype conversion included
    rows = torch.full((batch, 2, block + 1), float("-inf"), dtype=torch.float32, device=device)
    dec = torch.empty((batch, max_frames, block), dtype=torch.int8, device=device)
    path = torch.zeros((batch, max_text, max_frames), dtype=torch.float32, device=device)
    t_x = text_lengths.to(device=device, dtype=torch.int32, non_blocking=True)
    t_y = frame_lengths.to(device=device, dtype=torch.int32, non_blocking=True)
    _mas_kernel[(batch,)](
        ll, t_x, t_y, rows, dec, path, max_text, max_frames, BLOCK=block, num_warps=4 if block <= 512 else 8
    )
    return path
