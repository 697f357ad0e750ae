"""Pure parsers of server replies (INFO, CLUSTER NODES, ROLE, CONFIG GET) and config value comparison.

No I/O here: opsctl.net.observer fetches the replies, these functions turn them into data.

What one node said in one look, parsed: the record every observer fills and NodeFacts is made from.

A master's own account of its replicas (INFO replication): a replica may report its link up before its master
counts it (Redis 7.0 and Valkey put it online at its first REPLCONF ACK), and writes under min-replicas-to-write
wait for the master's count, not the replica's. Pure.

Server replies as text: the one bytes -> str rule.

Each fact opsctl reads from a node (ROLE, INFO by section, CLUSTER NODES, CLUSTER INFO, CONFIG GET) declared once, as
its command and its pure parser (opsctl.net.connection.Connection.read sends it)."""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.layout import Node, endpoint
from opsctl.spec.text import split_args

# --- INFO ---------------------------------------------------------------------------------------


def server_of(info: Mapping[str, str]) -> tuple[str, tuple[int, int]] | None:
    """(flavor, (major, minor)) a node reports in INFO server; Valkey also reports a redis_version."""
    for flavor, key in (("valkey", "valkey_version"), ("redis", "redis_version")):
        if info.get(key):
            major, minor = info[key].split(".")[:2]
            return flavor, (int(major), int(minor))
    return None


def parse_info(text: str) -> dict[str, str]:
    """INFO (or CLUSTER INFO) text as flat key -> value. Keyspace lines ('db0:keys=1,...') keep raw values."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, value = line.split(":", 1)
        out[key] = value
    return out


def parse_pairs(reply: Sequence[Any] | Mapping[Any, Any]) -> dict[str, str]:
    """A flat [k1, v1, k2, v2, ...] reply (RESP2) or a map (RESP3) as a dict of strings."""
    if isinstance(reply, Mapping):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


# --- CLUSTER NODES --------------------------------------------------------------------------------

SLOTS = 16384
FAILING_FLAGS = frozenset({"fail", "fail?"})


@frozen
class ClusterNodeLine(Frozen):
    """One line of CLUSTER NODES: a node as the observing node sees it."""

    id: str
    address: str
    port: int
    bus_port: int
    flags: frozenset[str]
    master_id: str | None
    config_epoch: int
    link_state: str
    slots: tuple[tuple[int, int], ...] = ()
    migrating: dict[int, str] = field(default_factory=dict)
    importing: dict[int, str] = field(default_factory=dict)
    hostname: str = ""

    @property
    def is_myself(self) -> bool:
        return "myself" in self.flags

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_failing(self) -> bool:
        """fail or pfail (shown as 'fail?')."""
        return bool(self.flags & FAILING_FLAGS)

    @property
    def endpoint(self) -> str:
        return endpoint(self.address, self.port)

    @property
    def slot_count(self) -> int:
        return sum(end - start + 1 for start, end in self.slots)


def _split_address(text: str) -> tuple[str, int, int, str]:
    """'ip:port@cport[,hostname[,aux...]]' -> (ip, port, bus port, hostname); ip is '' when unknown."""
    main, _, rest = text.partition(",")
    hostname = rest.split(",", 1)[0] if rest and "=" not in rest.split(",", 1)[0] else ""
    hostport, _, bus = main.partition("@")
    address, _, port = hostport.rpartition(":")
    return address.strip("[]"), int(port or 0), int(bus or 0), hostname


def _parse_slots(tokens: Sequence[str]) -> tuple[list[tuple[int, int]], dict[int, str], dict[int, str]]:
    """A line's slot tokens: ranges, then open slots ([slot->-target] migrating, [slot-<-source] importing). One
    loop, no call per token: a node in the middle of a move lists thousands of open slots, read a few times a wave."""
    slots: list[tuple[int, int]] = []
    migrating: dict[int, str] = {}
    importing: dict[int, str] = {}
    for token in tokens:
        if token.startswith("["):
            slot, arrow, peer = token.strip("[]").partition("->-")
            if arrow:
                migrating[int(slot)] = peer
                continue
            slot, arrow, peer = slot.partition("-<-")
            if arrow:
                importing[int(slot)] = peer
            continue
        start, _, end = token.partition("-")
        slots.append((int(start), int(end or start)))
    return slots, migrating, importing


def parse_cluster_node_line(line: str) -> ClusterNodeLine:
    parts = line.split()
    if len(parts) < 8:
        raise ValueError(f"not a CLUSTER NODES line: {line!r}")
    address, port, bus, hostname = _split_address(parts[1])
    slots, migrating, importing = _parse_slots(parts[8:])
    return ClusterNodeLine(
        id=parts[0], address=address, port=port, bus_port=bus,
        flags=frozenset(f for f in parts[2].split(",") if f and f != "noflags"),
        master_id=None if parts[3] == "-" else parts[3], config_epoch=int(parts[6]), link_state=parts[7],
        slots=tuple(slots), migrating=migrating, importing=importing, hostname=hostname)


def parse_cluster_nodes(text: str) -> list[ClusterNodeLine]:
    """CLUSTER NODES text, one ClusterNodeLine per non-empty line. A line is parsed once per process: polling a
    cluster of n nodes reads n views of the same n lines (n² lines), which differ only in the ping and pong
    times a ClusterNodeLine does not keep."""
    return [_parse_once(_timeless(line)) for line in text.splitlines() if line.strip()]


def _timeless(line: str) -> str:
    """The line with its ping-sent and pong-received times as 0."""
    parts = line.split()
    return " ".join([*parts[:4], "0", "0", *parts[6:]]) if len(parts) >= 8 else line


@functools.lru_cache(maxsize=16384)
def _parse_once(line: str) -> ClusterNodeLine:
    return parse_cluster_node_line(line)


LINE_ID = operator.attrgetter("id")  # a ClusterNodeLine's id, read in C: map(LINE_ID, view) over views of n lines


def distinct_lines(views: Iterable[Sequence[ClusterNodeLine] | None]) -> list[ClusterNodeLine]:
    """Each line object of views once, in the order first seen: for questions about the set of lines (which slots
    any view shows served), asked of ~2n objects instead of n² lines (see lines_where)."""
    listed = [view for view in views if view]
    lines = itertools.chain.from_iterable(listed)
    return list(dict(zip(map(id, itertools.chain.from_iterable(listed)), lines, strict=True)).values())


def lines_where(views: Iterable[Sequence[ClusterNodeLine] | None], keep: Callable[[ClusterNodeLine], bool]
                ) -> Iterator[ClusterNodeLine]:
    """Every line of views for which keep(line), in views' order: what `for view in views for line in view if
    keep(line)` gives, at a fraction of its cost (kept_objects)."""
    listed = [view for view in views if view]
    kept = kept_objects(listed, keep)
    for view in listed:
        if kept is None:
            yield from (line for line in view if keep(line))
        elif not kept.isdisjoint(map(id, view)):
            yield from (line for line in view if id(line) in kept)


def kept_objects(views: Iterable[Sequence[ClusterNodeLine] | None], keep: Callable[[ClusterNodeLine], bool]
                 ) -> set[int] | None:
    """The id() of each line object of views for which keep(line); None when the views share no object (built
    apart, not parsed here): then ask every line. Invariant: keep is a function of the line alone. Why: n views of
    n lines are n² lines (a million at 1000 nodes); parse_cluster_nodes makes one object per distinct line, so keep
    is asked once per object, and a view holding none of them (`kept.isdisjoint(map(id, view))`, in C) is passed
    over."""
    listed = [view for view in views if view]
    if len(listed) > 1 and set(map(id, listed[0])).isdisjoint(map(id, listed[1])):
        return None
    return {id(line) for line in distinct_lines(listed) if keep(line)}


def myself(view: Sequence[ClusterNodeLine]) -> ClusterNodeLine | None:
    return next((line for line in view if line.is_myself), None)


# --- ROLE ---------------------------------------------------------------------------------------


@frozen
class RoleInfo(Frozen):
    """A ROLE reply. kind: master | replica | sentinel. For a sentinel, `monitors` names its masters."""

    kind: str
    offset: int = 0
    master: tuple[str, int] | None = None
    link: str | None = None
    replicas: tuple[tuple[str, int, int], ...] = ()
    monitors: tuple[str, ...] = ()


def parse_role(reply: Sequence[Any]) -> RoleInfo:
    """ROLE as redis-py returns it: ['master', off, [[ip, port, off], ...]] | ['slave', ip, port, state, off]
    | ['sentinel', [names]]."""
    kind = as_text(reply[0])
    if kind == "master":
        replicas = tuple((as_text(r[0]), int(r[1]), int(r[2])) for r in reply[2])
        return RoleInfo("master", int(reply[1]), replicas=replicas)
    if kind in ("slave", "replica"):
        return RoleInfo("replica", int(reply[4]), (as_text(reply[1]), int(reply[2])), as_text(reply[3]))
    if kind == "sentinel":
        return RoleInfo("sentinel", monitors=tuple(as_text(n) for n in reply[1]))
    raise ValueError(f"unknown ROLE reply {kind!r}")


# --- config values --------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^(-?\d+)(b|k|kb|m|mb|g|gb)?$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def to_bytes(size: str) -> int:
    """A Redis memory size as bytes: k=1000, kb=1024, m=1000², mb=1024², g, gb (case-insensitive)."""
    match = _SIZE_RE.match(size.strip())
    if not match:
        raise ValueError(f"not a size: {size!r}")
    return int(match[1]) * _UNITS[(match[2] or "").lower()]


def _is_size(value: str) -> bool:
    return bool(_SIZE_RE.match(value.strip()))


# Lines of a rendered file that are not configs: CONFIG GET never reports them, CONFIG SET cannot set them.
NOT_CONFIG = frozenset({"rename-command", "user", "include", "loadmodule"})

# Found by CONFIG SET <name> <current value> on Valkey 9.1 and Redis 7.0 (enable-protected-configs no):
# both answered "can't set immutable config" (union of both; see IMMUTABLE_BY_FLAVOR for the split).
_IMMUTABLE_BOTH = frozenset({
    "aclfile", "always-show-logo", "aof_rewrite_cpulist", "appenddirname", "appendfilename", "bgsave_cpulist",
    "bio_cpulist", "cluster-config-file", "cluster-enabled", "cluster-port", "daemonize", "databases",
    "disable-thp", "enable-debug-command", "enable-module-command", "enable-protected-configs", "logfile",
    "pidfile", "rdbchecksum", "replicaof", "server_cpulist", "set-proc-title", "slaveof", "socket-mark-id",
    "supervised", "syslog-enabled", "syslog-facility", "syslog-ident", "tcp-backlog", "unixsocket",
    "unixsocketperm",
})
IMMUTABLE_BY_FLAVOR: dict[str, frozenset[str]] = {
    "valkey": _IMMUTABLE_BOTH | {"aof-rewrite-cpulist", "bgsave-cpulist", "bio-cpulist", "cluster-databases",
                                 "hash-seed", "mptcp", "rdma-completion-vector", "rdma-rx-size", "repl-mptcp",
                                 "server-cpulist", "unixsocketgroup"},
    "redis": _IMMUTABLE_BOTH | {"io-threads", "io-threads-do-reads"},
}
IMMUTABLE: frozenset[str] = IMMUTABLE_BY_FLAVOR["valkey"] | IMMUTABLE_BY_FLAVOR["redis"]
# "can't set protected config" on both while enable-protected-configs is no.
PROTECTED: frozenset[str] = frozenset({"dir", "dbfilename"})


def is_config_directive(directive: str) -> bool:
    """False for rename-command, user, include, loadmodule and sentinel lines: never in CONFIG GET/SET."""
    name = directive.strip().lower()
    return name not in NOT_CONFIG and not name.startswith("sentinel ")


_ENUMS = frozenset({"maxmemory-policy", "appendfsync", "loglevel", "supervised", "repl-diskless-load",
                    "sanitize-dump-payload", "propagation-error-behavior", "shutdown-on-sigterm",
                    "shutdown-on-sigint", "enable-protected-configs", "enable-debug-command",
                    "enable-module-command", "latency-tracking-info-percentiles", "oom-score-adj",
                    "cluster-preferred-endpoint-type"})
_SETS = frozenset({"bind"})
_PATHS = frozenset({"dir", "logfile", "pidfile", "aclfile", "unixsocket"})


def _save_pairs(tokens: list[str]) -> list[tuple[int, int]]:
    if not tokens or tokens == [""]:
        return []
    return sorted((int(tokens[i]), int(tokens[i + 1])) for i in range(0, len(tokens) - 1, 2))


def _obuf_classes(tokens: list[str]) -> dict[str, tuple[int, int, int]]:
    alias = {"slave": "replica"}
    return {alias.get(tokens[i].lower(), tokens[i].lower()):
            (to_bytes(tokens[i + 1]), to_bytes(tokens[i + 2]), int(tokens[i + 3]))
            for i in range(0, len(tokens) - 3, 4)}


def _token_equal(directive: str, desired: str, live: str) -> bool:
    if desired == live:
        return True
    if desired.lower() in ("yes", "no") or directive in _ENUMS:
        return desired.lower() == live.lower()
    if directive in _PATHS:
        return desired.rstrip("/") == live.rstrip("/")
    if _is_size(desired) and _is_size(live):
        return to_bytes(desired) == to_bytes(live)
    return False


def config_equal(directive: str, desired: str, live: str) -> bool:
    """Whether a rendered directive value (as in the config file, maybe quoted) means the live CONFIG GET value.

    Raises ValueError for lines that are not configs (rename-command, user, sentinel ...).
    """
    name = directive.strip().lower()
    if not is_config_directive(name):
        raise ValueError(f"{directive} is not a config CONFIG GET reports")
    tokens = split_args(desired)
    live_tokens = live.split()
    if name == "save":
        return _save_pairs(tokens) == _save_pairs(live_tokens)
    if name == "client-output-buffer-limit":
        have = _obuf_classes(live_tokens)
        return all(have.get(k) == v for k, v in _obuf_classes(tokens).items())
    if name in _SETS:
        return sorted(tokens) == sorted(live_tokens)
    if name == "notify-keyspace-events":
        return set("".join(tokens)) == set(live)
    if len(tokens) == 1:
        return _token_equal(name, tokens[0], live)
    if not tokens:
        return live == ""
    return len(tokens) == len(live_tokens) and all(
        _token_equal(name, a, b) for a, b in zip(tokens, live_tokens, strict=True))


@dataclass
class NodeObservation:
    """What one node said. info holds INFO merged with CLUSTER INFO (cluster_state, ...) for cluster nodes."""

    node: Node
    reachable: bool
    error: str = ""
    info: dict[str, str] = field(default_factory=dict)
    role: RoleInfo | None = None
    cluster_nodes: list[ClusterNodeLine] | None = None
    config: dict[str, str] | None = None
    fence: dict[str, str] | None = None  # CONFIG GET min-replicas-to-write, read where config is not


def listed_replicas(info: Mapping[str, str]) -> list[dict[str, str]]:
    """The master's slaveN entries (ip, port, state, offset, lag), in its order."""
    entries = [(int(key[5:]), value) for key, value in info.items() if key.startswith("slave") and key[5:].isdigit()]
    return [dict(p.split("=", 1) for p in value.split(",") if "=" in p) for _, value in sorted(entries)]


def master_side_problems(info: Mapping[str, str]) -> list[str]:
    """What keeps a master's replicas from counting, as the master says: a replica not online yet (wait_bgsave,
    send_bulk: its first sync is not done) and, under min-replicas-to-write, online replicas whose last ACK is older
    than min-replicas-max-lag (min_slaves_good_slaves, shown only when both are set: writes may get NOREPLICAS)."""
    if info.get("role") != "master":
        return []
    listed = listed_replicas(info)
    out = [f"lists replica {r.get('ip')}:{r.get('port')} as {r.get('state')} (its sync is not done)"
           for r in listed if r.get("state") != "online"]
    online = sum(1 for r in listed if r.get("state") == "online")
    good = info.get("min_slaves_good_slaves", "")
    if good.isdigit() and int(good) < online:
        out.append(f"counts {good} of {online} online replica(s) as acking within min-replicas-max-lag")
    return out


def as_text(value: bytes | str | object) -> str:
    """value decoded as UTF-8 when it is bytes (a stray byte becomes U+FFFD: a reply's odd byte must not stop a
    look), else str(value)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


Arg: TypeAlias = "bytes | str | int"

class RespError(Exception):
    """A node's error reply to one command, as a value among a pipeline's replies (the others' replies stand); an
    Exception too, so a caller may raise it. Equal by message, as a reply compares."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RespError) and type(other) is type(self) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)

    def __repr__(self) -> str:
        return f"RespError(message={self.message!r})"

Reply: TypeAlias = "bytes | int | list[Reply] | RespError | None"

Command: TypeAlias = "tuple[Any, ...]"  # a command's name, then its arguments (Arg values), as callers write them

TextReply: TypeAlias = "str | int | list[TextReply] | RespError | None"


# --- facts: what opsctl reads from a node, each declared once --------------------------------------------------------

T = TypeVar("T")


@frozen
class Fact(Frozen, Generic[T]):
    """One read of a node: the command (sent under the node's renames) and the pure parser of its reply as text."""

    command: Command
    parse: Callable[[TextReply], T]


def _text_of(reply: TextReply) -> str:
    if not isinstance(reply, str):
        raise TypeError(f"expected a text reply, got {type(reply).__name__}")
    return reply


def _list_of(reply: TextReply) -> list[TextReply]:
    if not isinstance(reply, list):
        raise TypeError(f"expected a list reply, got {type(reply).__name__}")
    return reply


def _role(reply: TextReply) -> RoleInfo:
    return parse_role(_list_of(reply))


def _info(reply: TextReply) -> dict[str, str]:
    return parse_info(_text_of(reply))


def _nodes(reply: TextReply) -> list[ClusterNodeLine]:
    return parse_cluster_nodes(_text_of(reply))


def _pairs(reply: TextReply) -> dict[str, str]:
    return parse_pairs(_list_of(reply))


ROLE: Fact[RoleInfo] = Fact(("ROLE",), _role)
CLUSTER_NODES: Fact[list[ClusterNodeLine]] = Fact(("CLUSTER", "NODES"), _nodes)
CLUSTER_INFO: Fact[dict[str, str]] = Fact(("CLUSTER", "INFO"), _info)


def info(section: str = "") -> Fact[dict[str, str]]:
    """INFO, of one section (or "all", "everything"); "" asks the server's default sections."""
    return Fact(("INFO", section) if section else ("INFO",), _info)


def config(pattern: str = "*") -> Fact[dict[str, str]]:
    """CONFIG GET pattern, as directive -> value."""
    return Fact(("CONFIG", "GET", pattern), _pairs)
