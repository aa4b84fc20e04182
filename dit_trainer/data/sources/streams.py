"""What every streamed data set needs to be split and to resume: its place among processes and DataLoader workers,
and random draws that are a function of a seed and a counter, so a stream's position is a few integers (saved in a
checkpoint, see ``stream_loader``) rather than a generator's whole state."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
from torch.utils.data import get_worker_info


def process_rank_and_world_size() -> tuple[int, int]:
    """This process's place in torch.distributed (initialised by accelerate), or (0, 1) when it runs alone."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def worker_and_workers() -> tuple[int, int]:
    """This DataLoader worker's id and the number of workers; (0, 1) in the main process."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


def seeded_int(*key: object) -> int:
    """A 64-bit integer that depends on ``key`` alone (the same in every process and Python run, unlike ``hash``
    of a string)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seeded_index(n: int, *key: object) -> int:
    """An index below ``n`` drawn from ``key`` (a seed and a draw counter)."""
    return seeded_int(*key) % n


def seeded_uniform(*key: object) -> float:
    """A number in [0, 1) drawn from ``key``."""
    return seeded_int(*key) / 2**64


@contextlib.contextmanager
def seeded_draws(*key: object) -> Iterator[None]:
    """torch's CPU generator seeded by ``key`` for what runs inside (an item's random crop, flip or caption, drawn
    where the sources draw them), and given back its own state after: the draws are the item's, not the reader's.
    Only the CPU's: ``torch.manual_seed`` would reseed the GPUs' generators too, which dropout draws from."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seeded_int(*key) >> 1)
        yield
