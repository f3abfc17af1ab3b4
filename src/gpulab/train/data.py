"""Training data: the data stage's digits (through its H5Dataset) and synthetic GPT tokens.

Batches come from a ``DataLoader`` over :class:`gpulab.data.api.H5Dataset` with a
``DistributedSampler`` whose ``set_epoch`` is called at every epoch, so each rank reads its own
disjoint shard and the shuffle changes between epochs (the same on every rank).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler


def open_digits(path: str | Path):
    from gpulab.data.api import H5Dataset  # the data stage's reader; imported late (optional dep)

    ds = H5Dataset(path)
    if len(ds.sample_shape) != 3:
        raise ValueError(f"{path}: digits samples must be [C, H, W], got {list(ds.sample_shape)}")
    return ds


class EpochBatches:
    """Endless (x, y) batches of one rank's shard; a new epoch (``set_epoch``) when one runs out."""

    def __init__(self, dataset, batch: int, rank: int = 0, replicas: int = 1, seed: int = 0,
                 shuffle: bool = True):
        self.sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=shuffle,
                                          seed=seed, drop_last=True)
        if len(self.sampler) < batch:
            raise ValueError(f"dataset of {len(dataset)} samples gives each of {replicas} rank(s) "
                             f"{len(self.sampler)}; too few for a local batch of {batch}")
        self.loader = DataLoader(dataset, batch_size=batch, sampler=self.sampler, drop_last=True)
        self.epoch = 0
        self._it: Iterator | None = None

    def __next__(self):
        if self._it is None:
            self.sampler.set_epoch(self.epoch)
            self._it = iter(self.loader)
        try:
            return next(self._it)
        except StopIteration:
            self.epoch += 1
            self._it = None
            return next(self)

    def __iter__(self):
        return self

    def steps_per_epoch(self) -> int:
        return len(self.loader)


def global_batch_indices(n: int, replicas: int, local_batch: int, step: int, epoch: int = 0,
                         seed: int = 0) -> list[int]:
    """The samples ``replicas`` DDP ranks see together at ``step``: the single-device reference
    trains on exactly this global batch in the equivalence check."""
    out = []
    for r in range(replicas):
        s = DistributedSampler(range(n), num_replicas=replicas, rank=r, shuffle=True, seed=seed,
                               drop_last=True)
        s.set_epoch(epoch)
        out += list(s)[step * local_batch:(step + 1) * local_batch]
    return out


def synthetic_tokens(n: int, seq_len: int, vocab: int, seed: int, noise: float = 0.1):
    """Token sequences with learnable structure: next = perm[current], except a ``noise`` fraction
    of random tokens. Deterministic in ``seed``. Returns (inputs, targets) shifted by one."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    seq = torch.empty(n, seq_len + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(vocab, (n,), generator=g)
    for t in range(1, seq_len + 1):
        nxt = perm[seq[:, t - 1]]
        rnd = torch.rand(n, generator=g) < noise
        seq[:, t] = torch.where(rnd, torch.randint(vocab, (n,), generator=g), nxt)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
