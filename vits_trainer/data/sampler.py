"""Batch samplers: which positions form each batch, in which order, on which rank.

`BucketBatchSampler` groups clips of similar length so padding stays small; `ReplayBatchSampler` mixes
a fixed set with a fresh replay draw per epoch under the same bucketing and sharding rules. Both work on
lengths and positions only, never on audio.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length in random order, sharded across ranks.

    Shuffled: a seeded permutation is cut into pools of `batch_size * bucket_size_multiplier`, each
    pool sorted by length and cut into batches, then the batch order is shuffled: padding stays
    small but the order stays random. Unshuffled (validation): sorted by length, deterministic.
    Every rank gets the same number of batches (a few repeated to pad), disjoint otherwise.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size_multiplier: int = 20,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in [0, {num_replicas})")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.bucket_size_multiplier = max(1, bucket_size_multiplier)
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._start = 0
        self._sizes: tuple[int, np.ndarray] | None = None  # (epoch, its batches' sizes): samples_in

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start(self, batch_index: int) -> None:
        """Resume mid-epoch: the next iteration skips its first `batch_index` batches (once)."""
        self._start = max(0, int(batch_index))

    def samples_in(self, first: int, end: int) -> int:
        """The epoch's samples in every rank's batches `first`..`end` - 1 together, each counted once: the
        same on every rank, with no communication. A rank's copy of an earlier batch, which gives every
        rank as many batches at the epoch's end, is not counted, and a short last batch counts its own
        clips (one rank's clips times the ranks counted both as full ones)."""
        if self._sizes is None or self._sizes[0] != self.epoch:
            self._sizes = (self.epoch, np.array([len(b) for b in self._all_batches()], dtype=np.int64))
        sizes = self._sizes[1]
        kept = min(len(sizes), self._rank_count(len(sizes)) * self.num_replicas)  # trained by some rank
        return int(sizes[first * self.num_replicas : min(end * self.num_replicas, kept)].sum())

    def _all_batches(self) -> list[np.ndarray]:
        n = len(self.lengths)
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")
            batches = [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        else:
            rng = np.random.default_rng([self.seed, self.epoch])
            perm = rng.permutation(n)
            pool = self.batch_size * self.bucket_size_multiplier
            batches = []
            for start in range(0, n, pool):
                chunk = perm[start : start + pool]
                # stable sort of a random permutation: equal lengths stay in random order
                chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
                batches.extend(chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        return batches

    def _rank_count(self, total: int) -> int:
        if self.drop_last:
            return total // self.num_replicas
        return math.ceil(total / self.num_replicas)

    def _rank_batches(self) -> list[np.ndarray]:
        batches = self._all_batches()
        per_rank = self._rank_count(len(batches))
        needed = per_rank * self.num_replicas
        if needed > len(batches) and batches:
            batches = batches + [batches[i % len(batches)] for i in range(needed - len(batches))]
        return batches[:needed][self.rank :: self.num_replicas]

    def __len__(self) -> int:
        # pools are whole multiples of batch_size, so at most one batch per epoch is short
        n = len(self.lengths)
        total = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return self._rank_count(total)

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        for batch in self._rank_batches()[start:]:
            yield batch.tolist()


class ReplayBatchSampler(Sampler[list[int]]):
    """Each epoch: every position in `fixed` plus `replay_count` positions drawn from `replay_pool`,
    bucketed and sharded exactly as `BucketBatchSampler` does (same set_epoch/set_start/__len__).

    The replay draw is fresh every epoch, seeded by (seed, epoch) so every rank and every resume draws
    the same clips; without replacement while the pool lasts (whole permutations of the pool are
    chained when more clips are asked for than it holds).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        fixed: Sequence[int],
        replay_pool: Sequence[int],
        replay_count: int,
        batch_size: int,
        seed: int = 0,
        bucket_size_multiplier: int = 20,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if replay_count < 0:
            raise ValueError(f"replay_count must be >= 0, got {replay_count}")
        if replay_count > 0 and len(replay_pool) == 0:
            raise ValueError("replay_count > 0 but the replay pool is empty")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.fixed = np.asarray(fixed, dtype=np.int64)
        self.replay_pool = np.asarray(replay_pool, dtype=np.int64)
        self.replay_count = int(replay_count)
        self.seed = seed
        self.epoch = 0
        self._start = 0
        self._counting: BucketBatchSampler | None = None  # this epoch's, for samples_in
        # a template for the counting and sharding rules: the per-epoch sampler has the same size
        self._template = BucketBatchSampler(
            np.zeros(self.epoch_size, dtype=np.int64),
            batch_size,
            shuffle=True,
            seed=seed,
            bucket_size_multiplier=bucket_size_multiplier,
            drop_last=drop_last,
            num_replicas=num_replicas,
            rank=rank,
        )

    @property
    def epoch_size(self) -> int:
        """Items one epoch holds across all ranks (before padding to equal rank shares)."""
        return len(self.fixed) + self.replay_count

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start(self, batch_index: int) -> None:
        """Resume mid-epoch: the next iteration skips its first `batch_index` batches (once)."""
        self._start = max(0, int(batch_index))

    def replay_draw(self, epoch: int) -> np.ndarray:
        """The replay positions of `epoch` (the same on every rank and every resume)."""
        if self.replay_count == 0:
            return np.zeros(0, dtype=np.int64)
        # a separate stream from the bucketing's [seed, epoch] one, so the draw does not shape the order
        rng = np.random.default_rng([self.seed, epoch, 1])
        rounds = math.ceil(self.replay_count / len(self.replay_pool))
        order = np.concatenate([rng.permutation(self.replay_pool) for _ in range(rounds)])
        return order[: self.replay_count]

    def epoch_items(self, epoch: int) -> np.ndarray:
        """All positions of `epoch`: the fixed ones, then that epoch's replay draw."""
        return np.concatenate([self.fixed, self.replay_draw(epoch)])

    def _epoch_sampler(self) -> tuple[BucketBatchSampler, np.ndarray]:
        items = self.epoch_items(self.epoch)
        inner = copy.copy(self._template)  # the same settings, this epoch's clips
        inner.lengths = self.lengths[items]
        inner.set_epoch(self.epoch)
        return inner, items

    def __len__(self) -> int:
        return len(self._template)

    def samples_in(self, first: int, end: int) -> int:
        """As BucketBatchSampler.samples_in, for this epoch's clips (its sampler kept for the epoch's steps)."""
        if self._counting is None or self._counting.epoch != self.epoch:
            self._counting = self._epoch_sampler()[0]
        return self._counting.samples_in(first, end)

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        inner, items = self._epoch_sampler()
        for batch in inner._rank_batches()[start:]:
            yield items[batch].tolist()
