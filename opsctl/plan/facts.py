"""What the shell observed, as plain data for the planner: process, last applied record, live replies.

The write fence, pure part: its value, how to see it in a CONFIG GET reply, what lifting it restores.

An old master is fenced during a Sentinel or plain-replication failover: `min-replicas-to-write` far above any
replica count makes it answer NOREPLICAS to every write, and that outlives opsctl (the I/O lives in
opsctl.failover.fence)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import digest
from opsctl.observe.replies import LINE_ID, ClusterNodeLine, NodeObservation, RoleInfo, server_of
from opsctl.plan import facts as fencing
from opsctl.spec.deployed import NodeRecord

if TYPE_CHECKING:  # spec_values renders; fenced, which status and health ask, needs none of it
    from opsctl.spec.layout import Node
    from opsctl.spec.load import LoadedSpec

@frozen
class SentinelEntry(Frozen):
    """A sentinel's SENTINEL MASTER entry beyond its address: the configuration epoch it holds and whether it
    runs a failover of that master now (its entry names the old master until the failover ends)."""

    config_epoch: int
    failing_over: bool


@frozen
class NodeFacts(Frozen):
    name: str
    running: bool
    process_detail: str = ""
    record: NodeRecord = NodeRecord()
    reachable: bool = False
    error: str = ""
    info: Mapping[str, str] = field(default_factory=dict)
    role: RoleInfo | None = None
    cluster_nodes: tuple[ClusterNodeLine, ...] | None = None
    config: Mapping[str, str] | None = None
    fence: Mapping[str, str] | None = None  # CONFIG GET min-replicas-to-write alone, in a look without config
    on_disk: Mapping[str, str] | None = None  # the config file's values, secrets as verdicts (plan.desired)
    acl_on_disk: str | None = None  # users.acl: MASK when it is the spec's, else a verdict; None: no ACL file
    sentinel_config: Mapping[str, str] | None = None  # a sentinel's settings: live numbers, file auth-pass
    accepts: Mapping[str, tuple[str, ...]] | None = None  # user -> verdicts of the passwords it accepts live
    exporter: str | None = None  # the settings digest its running redis_exporter was started with; None: none runs
    exporter_rules: tuple[str, ...] | None = None  # the exporter user's live ACL words; None: unread
    sentinel_entry: SentinelEntry | None = None  # a sentinel's epoch and failover state; None: unread

    @classmethod
    def from_observation(cls, name: str, seen: NodeObservation | None, running: bool | None = None,
                         detail: str = "", record: NodeRecord | None = None,
                         config: Mapping[str, str] | None = None) -> NodeFacts:
        """The one converter from a look to facts. running: what the provider said of the process (a look
        without a provider takes an answer for a running process); config: the live config as the caller may
        show it (secrets already turned into verdicts), None where the look did not read it."""
        record = record if record is not None else NodeRecord()
        if seen is None:
            return cls(name, bool(running), detail, record)
        views = tuple(seen.cluster_nodes) if seen.cluster_nodes is not None else None
        return cls(name, seen.reachable if running is None else running, detail, record, seen.reachable,
                   seen.error, seen.info, seen.role, views, config, seen.fence)

    @property
    def recorded_digest(self) -> str | None:
        return self.record.digest or None

    @property
    def recorded_directives(self) -> list[tuple[str, str]]:
        return list(self.record.directives)

    @property
    def fenced(self) -> bool:
        """Refuses writes behind an interrupted failover's fence (opsctl.plan.facts): from the whole config
        where the look read it, else from the fence's own read, which every look of a server does."""
        return fencing.fenced(self.config if self.config is not None else self.fence)

    @property
    def keys(self) -> int:
        """Keys in db0 (0 when unknown)."""
        raw = self.info.get("db0", "")
        for part in raw.split(","):
            if part.startswith("keys="):
                return int(part[5:])
        return 0

    @property
    def promoted(self) -> bool:
        """Was promoted from a replica (REPLICAOF NO ONE, a failover) and has not restarted since: INFO keeps the
        replication id it had as a replica as master_replid2 (all zeros, or absent, otherwise)."""
        return self.info.get("master_replid2", "").strip("0") != ""

    @property
    def history(self) -> tuple[str, int] | None:
        """(replication id, offset) of the data set it holds, from INFO: a replica's are its master's, up to what
        it processed (kept while its link is down; ROLE says -1 then). None when unknown."""
        replid, offset = self.info.get("master_replid"), self.info.get("master_repl_offset")
        return (replid, int(offset)) if replid and offset else None

    @property
    def promoted_at(self) -> tuple[str, int] | None:
        """(replication id, offset) it held as a replica when it was promoted (INFO master_replid2, and
        second_repl_offset, the first offset of its own history); None when not promoted."""
        first = self.info.get("second_repl_offset")
        return (self.info["master_replid2"], int(first) - 1) if self.promoted and first else None

    @property
    def server(self) -> tuple[str, tuple[int, int]] | None:
        """(flavor, (major, minor)) the running process reports in INFO, None when unknown."""
        return server_of(self.info)

    @functools.cached_property
    def myself(self) -> ClusterNodeLine | None:
        """Its own line in its view. Cached (in the instance's __dict__, which equality, hashing and replace()
        never read): the planner asks each node's many times, and a view holds a line per node (1000 at most)."""
        return next((n for n in self.cluster_nodes or () if n.is_myself), None)

    @property
    def sentinel_master(self) -> tuple[str, str, int] | None:
        """(name, address, port) of the master a sentinel monitors, from INFO's master0 line."""
        raw = self.info.get("master0", "")
        fields_ = dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
        if "name" not in fields_ or ":" not in fields_.get("address", ""):
            return None
        address, port = fields_["address"].rsplit(":", 1)
        return fields_["name"], address, int(port)

    @property
    def sentinel_knows(self) -> tuple[int, int] | None:
        """(replicas, sentinels counting itself) a sentinel knows of its master, from INFO's master0 line: a
        stopped replica or sentinel stays counted until SENTINEL RESET."""
        raw = self.info.get("master0", "")
        fields_ = dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
        replicas, sentinels = fields_.get("slaves", ""), fields_.get("sentinels", "")
        return (int(replicas), int(sentinels)) if replicas.isdigit() and sentinels.isdigit() else None


Facts = Mapping[str, NodeFacts]  # every node's facts by name: what the pure deciders take


@functools.lru_cache(maxsize=64)
def _known(ids: frozenset[str]) -> str:
    """A digest of the node ids a view knows. Why: a cluster's views mostly know one set: at 1000 nodes, a million
    ids sorted and dumped once per view, against one digest per distinct set."""
    return digest(sorted(ids))


def fingerprint(facts: Mapping[str, NodeFacts]) -> str:
    """A digest of what the plan depends on; offsets, memory and timings are left out on purpose."""
    summary = {}
    for name, f in sorted(facts.items()):
        me = f.myself
        summary[name] = {
            "running": f.running, "digest": f.recorded_digest, "reachable": f.reachable,
            "role": f.role.kind if f.role else None, "master": f.role.master if f.role else None,
            "promoted": f.promoted,
            "id": me.id if me else None, "slots": me.slots if me else None,
            "known": _known(frozenset(map(LINE_ID, f.cluster_nodes or ()))),
            "config": dict(sorted((f.config or {}).items())),
            "on_disk": dict(sorted((f.on_disk or {}).items())), "acl_on_disk": f.acl_on_disk,
            "sentinel": dict(sorted((f.sentinel_config or {}).items())),
            "accepts": dict(sorted((f.accepts or {}).items())),
            "exporter": f.exporter, "exporter_rules": f.exporter_rules,
        }
    return digest(summary)


FENCE = "1000000"  # min-replicas-to-write no real shard reaches: every write gets NOREPLICAS
TO_WRITE, MAX_LAG = "min-replicas-to-write", "min-replicas-max-lag"
DEFAULTS = {TO_WRITE: "0", MAX_LAG: "10"}

__all__ = ["FENCE", "MAX_LAG", "TO_WRITE", "fenced", "is_fence", "spec_values"]


def fenced(config: Mapping[str, str] | None) -> bool:
    """Does this CONFIG GET reply show the fence?"""
    return (config or {}).get(TO_WRITE) == FENCE


def is_fence(name: str, value: str | None) -> bool:
    """Is this directive's live or on-disk value the fence? Then it is not drift for a CONFIG SET or a rewritten file
    to undo: finishing the failover lifts it (back to spec_values), and lifting it earlier makes two masters."""
    return name == TO_WRITE and value == FENCE


def spec_values(loaded: LoadedSpec, node: Node) -> dict[str, str]:
    """min-replicas-to-write and -max-lag as the spec renders them (persistence.min_replicas_*; the server's defaults
    where it renders none): what lifting the fence restores."""
    from opsctl.plan.desired import rendered_values

    return rendered_values(loaded, node, DEFAULTS)
