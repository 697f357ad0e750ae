"""Delete a big key without blocking the server: UNLINK where lazy freeing is on, otherwise rename it out
of the way (gc:{tag}:<digest>, same slot) and delete it in chunks. Routed to the shard that owns the key;
resumable, because the gc name is a function of the key: a second run finishes what the first left.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opsctl.audit.scan import Throttle
from opsctl.base.errors import OpsctlError
from opsctl.net.connection import Connection, connection_to
from opsctl.net.connector import Connector
from opsctl.net.discover import discover
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode
from opsctl.observe.replies import Arg, Reply, RespError, as_text
from opsctl.slots.members import find_node
from opsctl.slots.ranges import key_slot
from opsctl.spec.layout import Node
from opsctl.spec.layout import endpoint as format_endpoint
from opsctl.spec.load import LoadedSpec

DEFAULT_CHUNK = 500  # seeds/000 二(4): about 500 elements per batch call


def hash_tag(key: bytes) -> bytes:
    """The part of the key that is hashed: the first {...} with at least one byte inside, else the whole key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def gc_name(key: bytes, cluster: bool) -> bytes:
    """Where a key goes while it is deleted; same hash slot as the key in a cluster."""
    digest = hashlib.sha1(key).hexdigest()[:16].encode()
    if not cluster:
        return b"gc:" + digest
    tag = hash_tag(key)
    name = b"gc:{" + tag + b"}:" + digest
    if key_slot(name) != key_slot(key):
        raise OpsctlError("cannot name a gc key in the same slot", f"key {key!r} has braces that no hash tag keeps",
                          "delete it with UNLINK instead (drop --chunked)")
    return name


def choose_method(kind: str, lazyfree: bool, force_chunked: bool, gc_exists: bool) -> str:
    """unlink | chunked | resume (only a leftover gc key) | missing."""
    if kind == "none":
        return "resume" if gc_exists else "missing"
    if kind == "string" or (lazyfree and not force_chunked):
        return "unlink"
    return "chunked"


def parse_slot_owner(nodes_text: str, slot: int) -> tuple[str, int] | None:
    """CLUSTER NODES -> the (address, port) of the master serving slot."""
    for line in nodes_text.splitlines():
        parts = line.split()
        if len(parts) < 8 or "master" not in parts[2].split(","):
            continue
        for item in parts[8:]:
            if item.startswith("["):
                continue
            lo, _, hi = item.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                address, _, port = parts[1].split("@")[0].rpartition(":")
                return address, int(port)
    return None


@dataclass(frozen=True)
class DeletePlan:
    key: bytes
    node: str
    endpoint: str
    type: str
    size: int
    method: str
    gc_key: bytes
    gc_exists: bool
    chunk: int
    gc_type: str = "none"

    def describe(self) -> str:
        key = self.key.decode("utf-8", "backslashreplace")
        if self.method == "missing":
            return f"{key}: no such key on {self.node} ({self.endpoint}), nothing to do"
        steps = {"unlink": "UNLINK (freed by the lazyfree thread)",
                 "chunked": f"RENAMENX to {self.gc_key.decode(errors='replace')}, then delete {self.chunk} at a time",
                 "resume": f"resume deleting {self.gc_key.decode(errors='replace')} in chunks"}[self.method]
        return f"{key}: {self.type} of {self.size} on {self.node} ({self.endpoint}): {steps}"


@dataclass(frozen=True)
class DeleteResult:
    plan: DeletePlan
    removed: int
    round_trips: int
    seconds: float


def owner_node(loaded: LoadedSpec, nodes_text: str, key: bytes) -> Node:
    """The node serving key's slot in CLUSTER NODES, as the spec's Node (or a retired one a larger spec had), so
    the connector reaches it with the spec's auth, TLS and route (an SSH tunnel for admin_via_ssh hosts). Pure."""
    slot = key_slot(key)
    found = parse_slot_owner(nodes_text, slot)
    if found is None:
        raise OpsctlError(f"no master serves slot {slot}", hint="check `opsctl cluster check -f SPEC`")
    endpoint = format_endpoint(*found)
    node = find_node(loaded, endpoint)
    if node is None:
        raise OpsctlError(f"slot {slot} is served by {endpoint}, a node the spec does not describe",
                          "opsctl reaches nodes only as the spec describes them (address, auth, SSH tunnel)",
                          "add the node to the spec, or move its slots to a node of the spec (opsctl cluster "
                          "reshard)")
    return node


def owner(connector: Connector, key: bytes) -> Connection:
    """The handle of the master that serves key (the only master outside a cluster)."""
    loaded = connector.loaded
    live = [ln for ln in discover(connector) if ln.role != "down"]
    masters = [ln for ln in live if ln.role == "master"]
    if not masters:
        raise OpsctlError("no reachable master", hint="start the fleet: opsctl apply -f SPEC")
    if loaded.spec.topology != "cluster":
        return connection_to(connector, masters[0].node)
    with connection_to(connector, masters[0].node) as handle:
        text = as_text(handle.call("CLUSTER", "NODES"))
    return connection_to(connector, owner_node(loaded, text, key))


def _size_of(pipe: RawPipe, kind: str, key: bytes) -> int:
    command = {"string": "STRLEN", "hash": "HLEN", "list": "LLEN", "set": "SCARD", "zset": "ZCARD",
               "stream": "XLEN"}.get(kind)
    reply = pipe.call(command, key) if command else 0
    return reply if isinstance(reply, int) else 0


def make_plan(loaded: LoadedSpec, handle: Connection, pipe: RawPipe, key: bytes, chunk: int, chunked: bool) \
        -> DeletePlan:
    kind = as_text(pipe.call("TYPE", key))
    gc = gc_name(key, loaded.spec.topology == "cluster")
    gc_kind = as_text(pipe.call("TYPE", gc))
    config = handle.config_get("lazyfree-lazy-*")
    lazyfree = "yes" in (config.get("lazyfree-lazy-user-del"), config.get("lazyfree-lazy-server-del"))
    method = choose_method(kind, lazyfree, chunked, gc_kind != "none")
    size = _size_of(pipe, kind if kind != "none" else gc_kind, key if kind != "none" else gc)
    return DeletePlan(key, handle.name, handle.endpoint, kind if kind != "none" else gc_kind, size, method, gc,
                      gc_kind != "none", chunk, gc_kind)


def _checked(replies: Sequence[Reply]) -> Sequence[Reply]:
    for reply in replies:
        if isinstance(reply, RespError):
            raise OpsctlError("the server refused a delete step", reply.message,
                              "the key may have moved (reshard) or changed type; run the command again")
    return replies


def _drain_scanned(pipe: RawPipe, gc: bytes, kind: str, chunk: int, throttle: Throttle) -> tuple[int, int]:
    """SSCAN+SREM or HSCAN+HDEL: each round trip deletes the last batch and fetches the next."""
    scan, remove = ("SSCAN", "SREM") if kind == "set" else ("HSCAN", "HDEL")
    cursor, removed, trips = b"0", 0, 0
    members: list[bytes] = []
    while True:
        out = encode([pipe.name(remove), gc, *members]) if members else b""
        pipe.send(out + encode([pipe.name(scan), gc, cursor, "COUNT", chunk]))
        replies = _checked(pipe.read(2 if members else 1))
        trips += 1
        throttle.spend(len(replies))
        removed += replies[0] if members and isinstance(replies[0], int) else 0
        reply = replies[-1]
        if not isinstance(reply, list) or not isinstance(reply[1], list):
            raise OpsctlError(f"unexpected {scan} reply", repr(reply)[:200])
        cursor = reply[0] if isinstance(reply[0], bytes) else b"0"
        items = [i for i in reply[1] if isinstance(i, bytes)]
        members = items if kind == "set" else items[0::2]
        if cursor == b"0" and not members:
            return removed, trips


def _step(pipe: RawPipe, kind: str, gc: bytes, chunk: int, size: int) -> list[Arg]:
    if kind == "zset":
        return [pipe.name("ZREMRANGEBYRANK"), gc, 0, chunk - 1]
    if kind == "list":
        return [pipe.name("LTRIM"), gc, chunk, -1]
    return [pipe.name("XTRIM"), gc, "MAXLEN", max(0, size - chunk)]


def _drain_counted(pipe: RawPipe, gc: bytes, kind: str, chunk: int, throttle: Throttle) -> tuple[int, int]:
    """ZREMRANGEBYRANK, LTRIM or XTRIM: remove `chunk` elements per round trip until the key is empty."""
    length = {"zset": "ZCARD", "list": "LLEN", "stream": "XLEN"}[kind]
    size_reply = pipe.call(length, gc)
    size = size_reply if isinstance(size_reply, int) else 0
    removed = trips = 0
    while size > 0:
        step = _step(pipe, kind, gc, chunk, size)
        pipe.send(encode(step) + encode([pipe.name(length), gc]))
        replies = _checked(pipe.read(2))
        trips += 1
        throttle.spend(2)
        new_size = replies[1] if isinstance(replies[1], int) else 0
        removed += size - new_size
        size = new_size
    return removed, trips


def _drain(pipe: RawPipe, gc: bytes, kind: str, chunk: int, throttle: Throttle) -> tuple[int, int]:
    if kind in ("set", "hash"):
        removed, trips = _drain_scanned(pipe, gc, kind, chunk, throttle)
    elif kind in ("zset", "list", "stream"):
        removed, trips = _drain_counted(pipe, gc, kind, chunk, throttle)
    else:
        removed, trips = 0, 0
    _checked([pipe.call("UNLINK", gc)])
    return removed, trips + 1


def delete_big_key(connector: Connector, key: bytes, chunk: int = DEFAULT_CHUNK, chunked: bool = False,
                   dry_run: bool = False, rate: float | None = None) -> DeleteResult:
    """Plan, then (unless dry_run) delete: a leftover gc key first, then the key itself."""
    started = time.monotonic()
    with owner(connector, key) as handle, handle.dedicated() as pipe:
        plan = make_plan(connector.loaded, handle, pipe, key, chunk, chunked)
        if dry_run or plan.method == "missing":
            return DeleteResult(plan, 0, 0, 0.0)
        throttle = Throttle(rate)
        removed, trips = _drain(pipe, plan.gc_key, plan.gc_type, chunk, throttle) if plan.gc_exists else (0, 0)
        if plan.method == "unlink":
            _checked([pipe.call("UNLINK", key)])
            removed, trips = removed + plan.size, trips + 1
        elif plan.method == "chunked":
            if pipe.call("RENAMENX", key, plan.gc_key) != 1:
                raise OpsctlError(f"could not rename the key to {plan.gc_key!r}", hint="run the command again")
            more, more_trips = _drain(pipe, plan.gc_key, plan.type, chunk, throttle)
            removed, trips = removed + more, trips + more_trips + 1
    return DeleteResult(plan, removed, trips, time.monotonic() - started)
