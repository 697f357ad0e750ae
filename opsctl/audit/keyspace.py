"""What a scan learns about keys: big keys, TTLs and expiry clustering, LFU frequencies. Pure accumulators.

The scan engine feeds batches (key, type, size, expire-at, freq); each accumulator keeps only what its
findings and tables need, so a 1M-key node never sits in memory.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from opsctl.audit.keynames import prefix_of, shown
from opsctl.observe.findings import Finding, finding

TYPES = ("string", "hash", "list", "set", "zset", "stream")
SIZE_COMMAND = {"string": "STRLEN", "hash": "HLEN", "list": "LLEN", "set": "SCARD", "zset": "ZCARD", "stream": "XLEN"}


@dataclass(frozen=True)
class Thresholds:
    string_bytes: int = 10 * 1024
    elements: int = 5000
    top: int = 10
    max_key_length: int = 128
    no_ttl_share: float = 0.5
    no_ttl_min_keys: int = 100
    expiry_cluster_keys: int = 1000
    hot_freq: int = 100


@dataclass
class BigKey:
    key: bytes
    type: str
    size: int
    memory: int | None = None
    ttl_ms: int | None = None

    def row(self, node: str) -> dict[str, object]:
        unit = "bytes" if self.type == "string" else "elements"
        return {"node": node, "key": shown(self.key), "type": self.type, "size": self.size, "unit": unit,
                "memory": self.memory, "ttl_ms": self.ttl_ms}


@dataclass
class BigKeys:
    """Keys over the thresholds, the top-N per type, and totals per type."""

    thresholds: Thresholds
    big: list[BigKey] = field(default_factory=list)
    top: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    totals: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    top_described: list[BigKey] = field(default_factory=list)

    def add_batch(self, kind: str, keys: Sequence[bytes], sizes: Sequence[int]) -> None:
        if len(keys) != len(sizes):
            raise ValueError(f"{len(keys)} keys, {len(sizes)} sizes")
        self.totals[kind] += sum(sizes)
        self.counts[kind] += len(keys)
        limit = self.thresholds.string_bytes if kind == "string" else self.thresholds.elements
        heap = self.top.setdefault(kind, [])
        n = self.thresholds.top
        if sizes and len(heap) >= n and max(sizes) <= min(limit, heap[0][0]):
            return  # nothing big and nothing for the top-N (most batches once the top has filled): max() is C
        for key, size in zip(keys, sizes, strict=True):
            if size > limit:
                self.big.append(BigKey(key, kind, size))
            if len(heap) < n:
                heapq.heappush(heap, (size, key))
            elif size > heap[0][0]:
                heapq.heapreplace(heap, (size, key))

    def top_keys(self) -> list[BigKey]:
        return [BigKey(key, kind, size) for kind in TYPES
                for size, key in sorted(self.top.get(kind, []), reverse=True)]

    def findings(self, node: str) -> list[Finding]:
        return [_bigkey_finding(b, node, self.thresholds) for b in sorted(self.big, key=lambda b: (b.type, b.key))]


def _bigkey_finding(big: BigKey, node: str, t: Thresholds) -> Finding:
    name = shown(big.key)
    if big.type == "string":
        rule, limit, unit = "bigkey-string", t.string_bytes, "bytes"
    else:
        rule, limit, unit = "bigkey-collection", t.elements, "elements"
    severity = "high" if big.size > 10 * limit else "medium"
    fix = (f"split {name} into smaller keys (e.g. buckets by id hash); delete it without blocking with "
           f"`opsctl bigkey delete -f SPEC '{name}'`")
    memory = f", {big.memory} bytes in memory" if big.memory is not None else ""
    return finding(rule, severity, node, f"{big.type} {name}: {big.size} {unit} (limit {limit}){memory}", fix,
                   key=name, type=big.type, size=big.size, memory=big.memory, ttl_ms=big.ttl_ms)


@dataclass
class Expiries:
    """Per prefix: keys and keys without TTL; per second of expiry: how many keys expire then."""

    thresholds: Thresholds
    per_prefix: dict[str, list[int]] = field(default_factory=dict)
    seconds: Counter[int] = field(default_factory=Counter)

    def add_batch(self, keys: Sequence[bytes], expire_at_ms: Sequence[int]) -> None:
        for key, at in zip(keys, expire_at_ms, strict=True):
            if at == -2:
                continue
            counts = self.per_prefix.get(prefix_of(key))
            if counts is None:
                counts = self.per_prefix[prefix_of(key)] = [0, 0]
            counts[0] += 1
            if at == -1:
                counts[1] += 1
            else:
                self.seconds[at // 1000] += 1

    def rows(self) -> list[dict[str, object]]:
        return [{"prefix": p, "keys": n, "without_ttl": none, "share": round(none / n, 3)}
                for p, (n, none) in sorted(self.per_prefix.items()) if n]

    def findings(self, node: str, prefixes: bool = True) -> list[Finding]:
        t = self.thresholds
        out = missing_ttl_findings({node: self}) if prefixes else []
        for second, count in sorted(self.seconds.items()):
            if count >= t.expiry_cluster_keys:
                out.append(finding("ttl-clustered", "medium", node, f"{count} keys expire in the same second "
                                   f"(unix {second})", "add random jitter to the TTLs so expiries spread out",
                                   second=second, count=count))
        return out


def missing_ttl_findings(per_node: dict[str, Expiries]) -> list[Finding]:
    """The share of keys without TTL per prefix, over every scanned shard (a prefix spans shards)."""
    totals: dict[str, list[int]] = {}
    nodes: dict[str, set[str]] = {}
    for node, exp in per_node.items():
        for prefix, (n, none) in exp.per_prefix.items():
            into = totals.setdefault(prefix, [0, 0])
            into[0], into[1] = into[0] + n, into[1] + none
            nodes.setdefault(prefix, set()).add(node)
    out = []
    for prefix, (n, none) in sorted(totals.items()):
        t = next(iter(per_node.values())).thresholds
        if n >= t.no_ttl_min_keys and none / n > t.no_ttl_share:
            out.append(finding("ttl-missing", "low", ",".join(sorted(nodes[prefix])), f"prefix {prefix}: {none} of "
                               f"{n} keys have no TTL", "give these keys an EXPIRE (spread: base TTL plus random "
                               "jitter)", prefix=prefix, keys=n, without_ttl=none, share=round(none / n, 3)))
    return out


@dataclass
class HotKeys:
    """The top-N keys by LFU counter (OBJECT FREQ)."""

    thresholds: Thresholds
    heap: list[tuple[int, bytes]] = field(default_factory=list)

    def add_batch(self, keys: Sequence[bytes], freqs: Sequence[int]) -> None:
        n = self.thresholds.top
        for key, freq in zip(keys, freqs, strict=True):
            if len(self.heap) < n:
                heapq.heappush(self.heap, (freq, key))
            elif freq > self.heap[0][0]:
                heapq.heapreplace(self.heap, (freq, key))

    def rows(self, node: str) -> list[dict[str, object]]:
        return [{"node": node, "key": shown(k), "freq": f} for f, k in sorted(self.heap, reverse=True)]

    def findings(self, node: str) -> list[Finding]:
        return [finding("hotkey", "medium", node, f"hot key {shown(k)}: LFU counter {f}",
                        "cache it locally, split it into copies (key:1..n) or spread reads to replicas",
                        key=shown(k), freq=f)
                for f, k in sorted(self.heap, reverse=True) if f >= self.thresholds.hot_freq]


def shard_skew(used: dict[str, int], minimum: int = 64 * 1024 * 1024) -> list[Finding]:
    """A shard holding over twice the mean of the others (and at least `minimum` bytes more) is skewed."""
    out = []
    for node, mem in sorted(used.items()):
        others = [m for n, m in used.items() if n != node]
        if not others:
            continue
        mean = sum(others) / len(others)
        if mem > 2 * mean and mem - mean >= minimum:
            out.append(finding("memory-skew", "medium", node, f"{mem} bytes used vs {int(mean)} on average elsewhere",
                               "look at this shard's big keys; split them or move slots (opsctl reshard)",
                               used=mem, mean_elsewhere=int(mean)))
    return out
