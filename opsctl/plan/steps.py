"""The steps a plan is made of. Frozen and serialisable; each carries a human reason."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Step:
    kind: ClassVar[str] = "step"
    node: str
    reason: str

    def title(self) -> str:
        return f"{self.kind} {self.node}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class WriteConfig(Step):
    kind: ClassVar[str] = "write-config"
    digest: str = ""


@dataclass(frozen=True)
class StartNode(Step):
    kind: ClassVar[str] = "start"


@dataclass(frozen=True)
class StopNode(Step):
    kind: ClassVar[str] = "stop"


@dataclass(frozen=True)
class RestartNode(Step):
    kind: ClassVar[str] = "restart"
    needs_downtime: bool = False
    shard: int = 0


@dataclass(frozen=True)
class Failover(Step):
    """Graceful failover of master `node` onto an already updated replica, through the failover runbook."""

    kind: ClassVar[str] = "failover"
    shard: int = 0

    def title(self) -> str:
        return f"{self.kind} shard {self.shard} away from {self.node}"


@dataclass(frozen=True)
class ConfigSet(Step):
    kind: ClassVar[str] = "config-set"
    directive: str = ""
    value: str = ""

    def title(self) -> str:
        return f"{self.kind} {self.node} {self.directive} {self.value}"


@dataclass(frozen=True)
class AclLoad(Step):
    """ACL LOAD: the node takes the users.acl just written (users and passwords change without a restart)."""

    kind: ClassVar[str] = "acl-load"


@dataclass(frozen=True)
class SetPasswords(Step):
    """Make the node accept the spec's password (and the previous one while auth.previous_password is set):
    requirepass + ACL SETUSER in one MULTI on a server, ACL SETUSER + sentinel-pass on a sentinel."""

    kind: ClassVar[str] = "set-passwords"


@dataclass(frozen=True)
class FormCluster(Step):
    """Create a cluster from empty nodes: epochs, slots to the masters, meet, replicate, then wait until every node
    agrees (so no wait-converged step follows it). node = first master."""

    kind: ClassVar[str] = "form-cluster"
    members: tuple[str, ...] = ()

    def title(self) -> str:
        return f"{self.kind} of {len(self.members)} nodes ({', '.join(self.members)})"


@dataclass(frozen=True)
class JoinCluster(Step):
    kind: ClassVar[str] = "join-cluster"
    via: str = ""


@dataclass(frozen=True)
class Replicate(Step):
    """Make node a replica of master (CLUSTER REPLICATE in a cluster, REPLICAOF otherwise)."""

    kind: ClassVar[str] = "replicate"
    master: str = ""

    def title(self) -> str:
        return f"{self.kind} {self.node} -> {self.master}"


@dataclass(frozen=True)
class SentinelMonitor(Step):
    kind: ClassVar[str] = "sentinel-monitor"
    master: str = ""


@dataclass(frozen=True)
class SentinelSet(Step):
    """SENTINEL SET on a running sentinel: its file is Sentinel's own, so spec changes go in live."""

    kind: ClassVar[str] = "sentinel-set"
    settings: tuple[tuple[str, str], ...] = ()

    def title(self) -> str:
        return f"{self.kind} {self.node} " + ", ".join(f"{k} {v}" for k, v in self.settings)


@dataclass(frozen=True)
class FinishFailover(Step):
    """A failover was interrupted (opsctl killed): its fenced old master (node) becomes a replica of the shard's
    other master, or, when none was promoted, takes writes again. Decided from the live state when it runs."""

    kind: ClassVar[str] = "finish-failover"


@dataclass(frozen=True)
class WaitConverged(Step):
    kind: ClassVar[str] = "wait-converged"


@dataclass(frozen=True)
class MoveSlots(Step):
    """Move slots (ranges as text, e.g. "0-99,200") from node (a master) to target, with estimates."""

    kind: ClassVar[str] = "move-slots"
    target: str = ""
    slots: str = ""
    slot_count: int = 0
    est_keys: int = 0
    est_bytes: int = 0

    def title(self) -> str:
        return f"{self.kind} {self.slot_count} slots {self.node} -> {self.target} (~{self.est_keys} keys)"


@dataclass(frozen=True)
class CloseSlots(Step):
    """Close open slots: those a killed run journaled exactly as journaled, then any other open slot."""

    kind: ClassVar[str] = "close-slots"
    slots: str = ""

    def title(self) -> str:
        return f"{self.kind} {self.slots}"


@dataclass(frozen=True)
class RemoveNode(Step):
    """Stop a node the spec no longer has, then forget it on every other node (purge: delete its data too)."""

    kind: ClassVar[str] = "remove-node"
    purge: bool = False


STEP_TYPES: dict[str, type[Step]] = {cls.kind: cls for cls in (
    WriteConfig, StartNode, StopNode, RestartNode, ConfigSet, FormCluster, JoinCluster, Replicate,
    SentinelMonitor, WaitConverged, MoveSlots, CloseSlots, RemoveNode, Failover, SentinelSet, AclLoad,
    FinishFailover, SetPasswords)}


@dataclass(frozen=True)
class Plan:
    spec_name: str
    spec_digest: str
    fingerprint: str
    steps: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    replan: bool = False  # these steps come first: apply observes again after them and plans the rest

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict[str, Any]:
        return {"format": 1, "spec": self.spec_name, "spec_digest": self.spec_digest,
                "fingerprint": self.fingerprint, "steps": [s.to_dict() for s in self.steps],
                "notes": list(self.notes), "warnings": list(self.warnings), "replan": self.replan}
