"""How keys travel in MIGRATE batches: sized by bytes, big keys alone with a longer timeout. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_BATCH_BYTES = 4 * 1024 * 1024  # MIGRATE blocks the source for the whole batch: keep it short
MAX_BATCH_KEYS = 1000
BIG_KEY_BYTES = 8 * 1024 * 1024
BASE_TIMEOUT_MS = 10_000
SLOW_LINK_BYTES_PER_MS = 10_000  # assume at least ~10 MB/s between nodes when giving big keys more time


@dataclass(frozen=True)
class Batch:
    keys: tuple[bytes, ...]
    size: int
    timeout_ms: int
    big: bool = False


def timeout_ms(size: int, base_ms: int = BASE_TIMEOUT_MS) -> int:
    return base_ms + size // SLOW_LINK_BYTES_PER_MS


def base_timeout_ms(node_timeout_ms: int) -> int:
    """MIGRATE's base timeout: the source is blocked for all of it, so it stays under half the cluster's node
    timeout; else a stalled target gets the source failed over too. Pure."""
    return max(200, min(BASE_TIMEOUT_MS, node_timeout_ms // 2))


def engine_timeout_s(node_timeout_ms: int) -> float:
    """How long an engine connection waits for a node's next reply: a MIGRATE the node may be running for another
    of our connections, three node timeouts and a margin; a silent node (a split) then fails the round trip, and
    the mover looks at both ends (follows a failover) instead of waiting for the split to heal. Pure."""
    return max(15.0, base_timeout_ms(node_timeout_ms) / 1000 + 3 * node_timeout_ms / 1000 + 5)


def trip_timeout_s(plan_timeouts_ms: Sequence[int], node_timeout_ms: int) -> float:
    """The wait for each reply of a stream of MIGRATEs: its longest MIGRATE timeout (a big key's) on top of the
    engine's. Pure."""
    return max(plan_timeouts_ms, default=0) / 1000 + engine_timeout_s(node_timeout_ms)


def batches(keys: Sequence[bytes], sizes: Sequence[int | None], max_bytes: int = MAX_BATCH_BYTES,
            max_keys: int = MAX_BATCH_KEYS, big_bytes: int = BIG_KEY_BYTES,
            base_ms: int = BASE_TIMEOUT_MS) -> list[Batch]:
    """Split one slot's keys into MIGRATE batches of at most max_bytes / max_keys; a big key travels alone.

    sizes: MEMORY USAGE per key (None: the key vanished meanwhile, counted as 0).
    """
    sized = [int(raw or 0) for raw in sizes]
    total = sum(sized)
    if len(keys) <= max_keys and total <= max_bytes and max(sized, default=0) < big_bytes:
        return [Batch(tuple(keys), total, timeout_ms(total, base_ms))] if keys else []  # the common case, at C speed
    out: list[Batch] = []
    current: list[bytes] = []
    current_size = 0
    for key, raw in zip(keys, sizes, strict=True):
        size = int(raw or 0)
        if size >= big_bytes:
            out.append(Batch((key,), size, timeout_ms(size, base_ms), big=True))
            continue
        if current and (current_size + size > max_bytes or len(current) >= max_keys):
            out.append(Batch(tuple(current), current_size, timeout_ms(current_size, base_ms)))
            current, current_size = [], 0
        current.append(key)
        current_size += size
    if current:
        out.append(Batch(tuple(current), current_size, timeout_ms(current_size, base_ms)))
    return out


def rate_delay(done: int, elapsed: float, max_per_sec: float | None) -> float:
    """Seconds to wait so that `done` keys in `elapsed` seconds stay under max_per_sec (0: go on)."""
    if not max_per_sec or max_per_sec <= 0:
        return 0.0
    return max(0.0, done / max_per_sec - elapsed)


def backoff(attempt: int, first: float = 0.05, most: float = 1.0) -> float:
    """Seconds to wait before retry number `attempt` (1, 2, ...): doubling from first, at most most. Pure."""
    return float(min(most, first * pow(2.0, max(0, attempt - 1))))


def waves(slots: Sequence[int], first: int, most: int) -> list[list[int]]:
    """Split slots into waves that double from `first` up to `most` slots: the first wave's keys cannot be
    fetched ahead of time, so it is small; later waves are fetched while the one before moves."""
    out: list[list[int]] = []
    size, at = max(1, first), 0
    while at < len(slots):
        out.append(list(slots[at:at + size]))
        at += size
        size = min(max(1, most), size * 2)
    return out


def closed_first(sizes: Sequence[int], at: int, most_open: int) -> int:
    """How many waves (from the first) must be closed before wave `at` opens, so that at most most_open slots
    are open at once; sizes: each wave's slot count, in the order they open and close. Pure."""
    room = most_open - sizes[at]
    first = at
    while first > 0 and room >= sizes[first - 1]:
        room -= sizes[first - 1]
        first -= 1
    return first


def opened_together(sizes: Sequence[int], at: int, most_open: int, most: int, closed: int) -> int:
    """How many waves from `at` open in one go (one journal line, one look at both ends, one SETSLOT pipeline per end):
    the waves after it that fit with it within `most` slots and need no more than `closed` waves closed first
    (closed_first). The first wave opens alone, so the stream starts with it. Why: an opening costs more than a small
    wave takes to move. Pure."""
    if at == 0:
        return 1
    end, total = at + 1, sizes[at]
    while end < len(sizes) and total + sizes[end] <= most and closed_first(sizes, end, most_open) <= closed:
        total += sizes[end]
        end += 1
    return end - at
