"""The cutover's checks: key counts of source and target (TTL-aware) and sampled values with their expiries.

Counts first come from INFO keyspace; when they differ, both sides are counted again with SCAN, which leaves out
keys whose time ran out but that no one reclaimed yet (a server counts those until it touches them), so a key
that expired during the migration is not "missing". A sampled key gone from the target is a problem only while
the source still has it.
"""

from __future__ import annotations

from collections.abc import Sequence

from opsctl.backup.plan import parse_keyspace
from opsctl.net.rawpipe import RawPipe
from opsctl.observe.replies import RespError, parse_info
from opsctl.restore.engine import Targets, value_of

TTL_SLACK_MS = 2000


def info_keys(pipe: RawPipe) -> int:
    reply = pipe.call("INFO", "keyspace")
    info = parse_info(reply.decode() if isinstance(reply, bytes) else "")
    return sum(keys for keys, _ in parse_keyspace(info).values())


def scan_keys(pipe: RawPipe, skip: bytes = b"") -> int:
    """Keys of db 0 a SCAN returns (expired ones are dropped as it meets them); keys starting with skip left out."""
    cursor, count = b"0", 0
    while True:
        reply = pipe.call("SCAN", cursor, "COUNT", 1000)
        if not isinstance(reply, list) or not isinstance(reply[0], bytes) or not isinstance(reply[1], list):
            raise RespError(f"unexpected SCAN reply from {pipe.label}")
        cursor = reply[0]
        count += sum(1 for k in reply[1] if isinstance(k, bytes) and not (skip and k.startswith(skip)))
        if cursor == b"0":
            return count


def count_problem(sources: Sequence[RawPipe], targets: Sequence[RawPipe], markers: int,
                  marker_prefix: bytes) -> tuple[int, int, str | None]:
    """(source keys, target keys, a problem or None)."""
    source = sum(info_keys(p) for p in sources)
    target = sum(info_keys(p) for p in targets) - markers
    if source == target:
        return source, target, None
    source = sum(scan_keys(p) for p in sources)
    target = sum(scan_keys(p, marker_prefix) for p in targets)
    if source == target:
        return source, target, None
    return source, target, f"the source holds {source} keys, the target {target} (counted by SCAN, expired keys out)"


def sample_problems(sources: Sequence[RawPipe], targets: Targets, pipes: Sequence[RawPipe], per_source: int,
                    shift_ms: int) -> tuple[int, list[str]]:
    """Up to per_source random keys of each source compared with the target: value and absolute expiry."""
    checked, problems = 0, []
    for src in sources:
        keys = {k for _ in range(per_source) if isinstance(k := src.call("RANDOMKEY"), bytes)}
        for key in sorted(keys):
            dst = pipes[targets.router.target(key)]
            problem = _key_problem(src, dst, key, shift_ms)
            checked += 1
            if problem:
                problems.append(problem)
            if len(problems) >= 10:
                return checked, problems
    return checked, problems


def _key_problem(src: RawPipe, dst: RawPipe, key: bytes, shift_ms: int) -> str | None:
    shown = key[:60].decode("utf-8", "replace")
    theirs = value_of(dst, 0, key)
    ours = value_of(src, 0, key)
    if ours != theirs:
        gone = ours[0] == b"none" if isinstance(ours, tuple) else False
        return None if gone else f"key {shown!r} differs between source and target"
    at_source, at_target = src.call("PEXPIRETIME", key), dst.call("PEXPIRETIME", key)
    if isinstance(at_source, int) and isinstance(at_target, int) and (at_source < 0) != (at_target < 0):
        return f"key {shown!r}: expiry {at_source} on the source, {at_target} on the target"
    if isinstance(at_source, int) and isinstance(at_target, int) and at_source > 0 and \
            abs(at_source + shift_ms - at_target) > TTL_SLACK_MS:
        return f"key {shown!r}: expires at {at_source} (source clock) but {at_target} on the target"
    return None
