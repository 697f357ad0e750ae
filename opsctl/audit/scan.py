"""The scan engine: one SCAN pass with a large COUNT, a bounded window of pipelined STRLEN (TYPE and the size
command only for keys that are not strings) / PEXPIRETIME / OBJECT FREQ requests, throttled, one thread
per shard. Results go to the pure
accumulators of opsctl.audit.keyspace and opsctl.audit.keynames.

Keeping a scan or a delete within a rate of operations per second."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, cast

from opsctl.audit.keynames import NameLint
from opsctl.audit.keyspace import SIZE_COMMAND, BigKey, BigKeys, Expiries, HotKeys, Thresholds
from opsctl.base.events import Emit, Event
from opsctl.base.frozen import Frozen, frozen
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.discover import LiveNode
from opsctl.net.fanout import Borrowed
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode, encode_keyed
from opsctl.observe.replies import Reply, RespError, parse_info


@frozen
class ScanProgress(Frozen, Event):
    """Keys an audit scan has read on one node so far, of the node's DBSIZE when it started."""

    kind: ClassVar[str] = "scan-progress"
    node: str
    done: int
    total: int

    def line(self) -> str:
        return f"{self.node}: {self.done}/{self.total} keys scanned"


@dataclass(frozen=True)
class ScanWants:
    sizes: bool = False
    expiry: bool = False
    freq: bool = False
    names: bool = False
    count: int = 1000
    batch: int = 250
    window: int = 3


@dataclass
class NodeScan:
    node: str
    shard: str
    thresholds: Thresholds
    keys: int = 0
    seconds: float = 0.0
    dbsize: int = 0
    used_memory: int = 0
    errors: int = 0
    first_error: str = ""
    bigkeys: BigKeys = field(init=False)
    expiries: Expiries = field(init=False)
    hot: HotKeys = field(init=False)
    names: NameLint = field(init=False)

    def __post_init__(self) -> None:
        t = self.thresholds
        self.bigkeys, self.expiries, self.hot = BigKeys(t), Expiries(t), HotKeys(t)
        self.names = NameLint(max_length=t.max_key_length)


def ints(replies: Sequence[Reply], missing: int) -> list[int]:
    """Integer replies; errors and nils (a key gone or retyped mid-scan) become `missing`."""
    return [r if isinstance(r, int) else missing for r in replies]


@dataclass
class _Request:
    tag: str  # scan | keys | type | size
    keys: list[bytes]
    count: int
    kind: str = ""


@dataclass
class _Scanner:
    """One pass of untyped SCAN. Each key is first asked STRLEN (most keys are strings); the few that answer
    WRONGTYPE are asked TYPE, then their size command. Requests carry `batch` keys and at most `window` are in
    flight, so the server always has work queued but never a long queue for a concurrent client to wait behind.
    """

    pipe: RawPipe
    wants: ScanWants
    result: NodeScan
    throttle: Throttle
    progress: Emit | None
    pending: list[bytes] = field(default_factory=list)
    retype: list[bytes] = field(default_factory=list)
    sized: dict[str, list[bytes]] = field(default_factory=dict)
    cursor: bytes | None = b"0"
    scanning: bool = False

    def _send(self, inflight: deque[_Request], request: _Request, data: bytes) -> None:
        if request.count:
            self.pipe.send(data)
            self.throttle.spend(request.count)
        inflight.append(request)

    def _take(self, queue: list[bytes]) -> list[bytes]:
        keys = queue[:self.wants.batch]
        del queue[:self.wants.batch]
        return keys

    def _next(self, inflight: deque[_Request]) -> bool:
        """Send the most useful next request; False when there is nothing to send."""
        kind = next((k for k, keys in self.sized.items() if keys), None)
        scan_done = self.cursor is None and not self.scanning and not self.pending
        if kind:
            keys = self._take(self.sized[kind])
            self._send(inflight, _Request("size", keys, len(keys), kind),
                       encode_keyed(self.pipe.name(SIZE_COMMAND[kind]), keys))
        elif self.retype and (len(self.retype) >= self.wants.batch or scan_done):
            keys = self._take(self.retype)
            self._send(inflight, _Request("type", keys, len(keys)), encode_keyed(self.pipe.name("TYPE"), keys))
        elif not self.scanning and self.cursor is not None and len(self.pending) < 2 * self.wants.batch:
            args: list[bytes | str | int] = [self.pipe.name("SCAN"), self.cursor, "COUNT", self.wants.count]
            self._send(inflight, _Request("scan", [], 1), encode(args))
            self.scanning = True
        elif self.pending:
            keys = self._take(self.pending)
            data, count = self.key_commands(keys)
            self._send(inflight, _Request("keys", keys, count), data)
        else:
            return False
        return True

    def key_commands(self, keys: list[bytes]) -> tuple[bytes, int]:
        commands = (["STRLEN"] if self.wants.sizes else []) + (["PEXPIRETIME"] if self.wants.expiry else [])
        parts = [encode_keyed(self.pipe.name(c), keys) for c in commands]
        if self.wants.freq:
            freq = self.pipe.name("OBJECT")
            parts.append(b"".join(encode([freq, b"FREQ", k]) for k in keys))
        return b"".join(parts), (len(commands) + self.wants.freq) * len(keys)

    def run(self) -> None:
        inflight: deque[_Request] = deque()
        while True:
            while len(inflight) < self.wants.window and self._next(inflight):
                pass
            if not inflight:
                return
            request = inflight.popleft()
            replies = self.pipe.read(request.count)
            getattr(self, f"_on_{request.tag}")(request, replies)

    def _on_scan(self, request: _Request, replies: list[Reply]) -> None:
        cursor, page = _scan_reply(replies[0])
        self.pending += page
        self.cursor, self.scanning = (None if cursor == b"0" else cursor), False

    def _failed(self, errors: list[RespError]) -> None:
        if errors:
            self.result.errors += len(errors)
            self.result.first_error = self.result.first_error or errors[0].message

    def _on_keys(self, request: _Request, replies: list[Reply]) -> None:
        keys, n, r = request.keys, len(request.keys), self.result
        pos = 0
        if self.wants.sizes:
            self._on_strlen(keys, replies[:n])
            pos = n
        self._failed([e for e in replies[pos:] if isinstance(e, RespError)])
        if self.wants.expiry:
            r.expiries.add_batch(keys, ints(replies[pos:pos + n], -2))
            pos += n
        if self.wants.freq:
            r.hot.add_batch(keys, ints(replies[pos:pos + n], 0))
        if self.wants.names:
            for key in keys:
                r.names.add(key)
        r.keys += n
        if self.progress:
            self.progress(ScanProgress(r.node, r.keys, r.dbsize))

    def _on_strlen(self, keys: list[bytes], replies: list[Reply]) -> None:
        """STRLEN's answers: sizes of strings; the keys that are not strings go to TYPE."""
        if set(map(type, replies)) == {int}:  # all strings (most batches): no Python step per key
            self.result.bigkeys.add_batch("string", keys, cast("list[int]", replies))
            return
        strings, sizes = [], []
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, int):
                strings.append(key)
                sizes.append(reply)
            elif isinstance(reply, RespError) and reply.message.startswith("WRONGTYPE"):
                self.retype.append(key)
        self.result.bigkeys.add_batch("string", strings, sizes)

    def _on_type(self, request: _Request, replies: list[Reply]) -> None:
        for key, reply in zip(request.keys, replies, strict=True):
            kind = reply.decode() if isinstance(reply, bytes) else ""
            if kind in SIZE_COMMAND:
                self.sized.setdefault(kind, []).append(key)

    def _on_size(self, request: _Request, replies: list[Reply]) -> None:
        self._failed([e for e in replies if isinstance(e, RespError)])
        self.result.bigkeys.add_batch(request.kind, request.keys, ints(replies, 0))


def _scan_reply(reply: Reply) -> tuple[bytes, list[bytes]]:
    if not isinstance(reply, list) or len(reply) != 2 or not isinstance(reply[1], list):
        raise ValueError(f"unexpected SCAN reply: {reply!r}")
    cursor = reply[0] if isinstance(reply[0], bytes) else b"0"
    page = reply[1]
    if set(map(type, page)) <= {bytes}:  # always, from a server: checked without a Python step per key
        return cursor, cast("list[bytes]", page)
    return cursor, [k for k in page if isinstance(k, bytes)]


def _describe_big(pipe: RawPipe, result: NodeScan) -> None:
    """MEMORY USAGE and TTL of the big keys and the top keys per type: few keys, one pipeline."""
    wanted = {(b.key, b.type): b for b in result.bigkeys.big}
    for b in result.bigkeys.top_keys():
        wanted.setdefault((b.key, b.type), b)
    if not wanted:
        return
    keys = [k for k, _ in wanted]
    pipe.send(b"".join(encode([pipe.name("MEMORY"), b"USAGE", k]) for k in keys)
              + encode_keyed(pipe.name("PEXPIRETIME"), keys))
    replies = pipe.read(2 * len(keys))
    now = int(time.time() * 1000)
    for big, memory, at in zip(wanted.values(), replies[:len(keys)], replies[len(keys):], strict=True):
        big.memory = memory if isinstance(memory, int) else None
        big.ttl_ms = (at - now if at >= 0 else at) if isinstance(at, int) else None
    result.bigkeys.top_described = [wanted[(b.key, b.type)] for b in result.bigkeys.top_keys()]


def scan_node(connector: Connector, target: LiveNode, wants: ScanWants, thresholds: Thresholds,
              rate: float | None = None, progress: Emit | None = None) -> NodeScan:
    result = NodeScan(target.node.name, target.shard_key, thresholds)
    started = time.monotonic()
    with connection_to(connector, target.node) as handle, handle.dedicated() as pipe:
        if connector.loaded.spec.topology == "cluster":
            pipe.call("READONLY")  # a cluster replica answers reads only after READONLY; masters ignore it
        size = pipe.call("DBSIZE")
        result.dbsize = size if isinstance(size, int) else 0
        _Scanner(pipe, wants, result, Throttle(rate), progress).run()
        if wants.sizes:
            _describe_big(pipe, result)
        info = pipe.call("INFO", "memory")
        fields = parse_info(info.decode() if isinstance(info, bytes) else "")
        result.used_memory = int(fields.get("used_memory", "0"))
    result.seconds = time.monotonic() - started
    return result


def scan_all(connector: Connector, targets: Sequence[LiveNode], wants: ScanWants, thresholds: Thresholds,
             rate: float | None = None, progress: Emit | None = None) -> list[NodeScan]:
    """Every shard in parallel; rate is per node."""
    if not targets:
        return []
    with Borrowed() as pool:  # all at once, not fan_out's WIDTH: every shard's scan runs from the start
        futures = [pool.submit(scan_node, connector, t, wants, thresholds, rate, progress) for t in targets]
        return [f.result() for f in futures]


__all__ = ["BigKey", "NodeScan", "ScanWants", "scan_all", "scan_node"]


def throttle_delay(started: float, spent: int, rate: float | None, now: float) -> float:
    """Seconds to wait so that `spent` operations since `started` stay within `rate` per second."""
    if not rate:
        return 0.0
    return max(0.0, started + spent / rate - now)


@dataclass
class Throttle:
    rate: float | None
    started: float = field(default_factory=time.monotonic)
    spent: int = 0

    def spend(self, ops: int) -> None:
        self.spent += ops
        delay = throttle_delay(self.started, self.spent, self.rate, time.monotonic())
        if delay > 0:
            time.sleep(delay)
