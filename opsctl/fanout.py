"""Run one function per item side by side (threads), for I/O on many nodes: SSH commands, SFTP reads, admin
round trips. A look at six remote nodes costs one round trip, not six in a row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
WIDTH = 16


def fan_out(fn: Callable[[T], R], items: Sequence[T], width: int = WIDTH) -> list[R]:
    """[fn(item) for item in items], run side by side; the first item's error (in order) is raised."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(width, len(items))) as pool:
        return list(pool.map(fn, items))
