"""The steps a plan is made of. Frozen and serialisable; each carries a human reason. (@frozen: dataclasses at a
fraction of the import cost of @dataclass(frozen=True), see opsctl.base.frozen.)"""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any, ClassVar

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import MASK
from opsctl.render.directives import SECRET_DIRECTIVES


@frozen
class Step(Frozen):
    kind: ClassVar[str] = "step"
    node: str
    reason: str

    def title(self) -> str:
        return f"{self.kind} {self.node}"

    def to_dict(self) -> dict[str, Any]:
        """JSON's shape: tuples as lists (what the plan file reader takes back into tuples)."""
        return {"kind": self.kind, **{k: _listed(v) for k, v in asdict(self).items()}}


def _listed(value: object) -> object:
    return [_listed(v) for v in value] if isinstance(value, tuple) else value


def _some(names: tuple[str, ...], shown: int = 6) -> str:
    """The first names and how many more: a title of a 240-node step stays one line (an error quotes it)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


UNSET = "(unset)"  # a setting's side of a change where the file has no such line

Change = tuple[str, str, str]  # (directive, before, after): secrets as verdicts or "***", never their values


@frozen
class WriteConfig(Step):
    """Write the node's files. changes: each single-valued setting that differs, before -> after (before: the last
    applied rendering, or the file on disk when it drifted), so a plan shows what changes instead of a digest;
    empty for a new node, whose every line is new."""

    kind: ClassVar[str] = "write-config"
    digest: str = ""
    changes: tuple[Change, ...] = ()


@frozen
class StartNode(Step):
    kind: ClassVar[str] = "start"


@frozen
class StopNode(Step):
    kind: ClassVar[str] = "stop"


@frozen
class RestartNode(Step):
    kind: ClassVar[str] = "restart"
    needs_downtime: bool = False
    shard: int = 0


@frozen
class Failover(Step):
    """Graceful failover of master `node` onto an already updated replica, through the failover runbook."""

    kind: ClassVar[str] = "failover"
    shard: int = 0
    to: str = ""  # the replica to promote ("": the runbook's or Sentinel's choice)

    def title(self) -> str:
        return f"{self.kind} shard {self.shard} away from {self.node}" + (f" to {self.to}" if self.to else "")


@frozen
class ConfigSet(Step):
    """CONFIG SET directive value on a running node; before: its live value (a secret's as a verdict)."""

    kind: ClassVar[str] = "config-set"
    directive: str = ""
    value: str = ""
    before: str = ""

    def title(self) -> str:
        value = MASK if self.directive in SECRET_DIRECTIVES else self.value  # the mask, whatever its quoting
        change = f"{self.before} -> {value}" if self.before else value
        return f"{self.kind} {self.node} {self.directive} {change}"


@frozen
class AclLoad(Step):
    """ACL LOAD: the node takes the users.acl just written (users and passwords change without a restart)."""

    kind: ClassVar[str] = "acl-load"


@frozen
class SetPasswords(Step):
    """Make the node accept the spec's password (and the previous one while auth.previous_password is set):
    requirepass + ACL SETUSER in one MULTI on a server, ACL SETUSER + sentinel-pass on a sentinel."""

    kind: ClassVar[str] = "set-passwords"


@frozen
class FormCluster(Step):
    """Create a cluster from empty nodes: epochs, slots to the masters, meet, replicate, then wait until every node
    agrees (so no wait-converged step follows it). node = first master."""

    kind: ClassVar[str] = "form-cluster"
    members: tuple[str, ...] = ()

    def title(self) -> str:
        return f"{self.kind} of {len(self.members)} nodes ({_some(self.members)})"


@frozen
class JoinCluster(Step):
    kind: ClassVar[str] = "join-cluster"
    via: str = ""


@frozen
class Replicate(Step):
    """Make node a replica of master (CLUSTER REPLICATE in a cluster, REPLICAOF otherwise)."""

    kind: ClassVar[str] = "replicate"
    master: str = ""

    def title(self) -> str:
        return f"{self.kind} {self.node} -> {self.master}"


@frozen
class SentinelMonitor(Step):
    kind: ClassVar[str] = "sentinel-monitor"
    master: str = ""


@frozen
class SentinelSet(Step):
    """SENTINEL SET on a running sentinel: its file is Sentinel's own, so spec changes go in live."""

    kind: ClassVar[str] = "sentinel-set"
    settings: tuple[tuple[str, str], ...] = ()

    def title(self) -> str:
        return f"{self.kind} {self.node} " + ", ".join(f"{k} {v}" for k, v in self.settings)


@frozen
class FinishFailover(Step):
    """A failover was interrupted (opsctl killed): its fenced old master (node) becomes a replica of the shard's
    other master, or, when none was promoted, takes writes again. Decided from the live state when it runs."""

    kind: ClassVar[str] = "finish-failover"


@frozen
class WaitConverged(Step):
    kind: ClassVar[str] = "wait-converged"


@frozen
class MoveSlots(Step):
    """Move slots (ranges as text, e.g. "0-99,200") from node (a master) to target, with estimates. fills: the
    shard whose master target is, when the move fills it (a scale-out: journaled before the move, so an apply
    stopped part way plans the rest), else 0."""

    kind: ClassVar[str] = "move-slots"
    target: str = ""
    slots: str = ""
    slot_count: int = 0
    est_keys: int = 0
    est_bytes: int = 0
    fills: int = 0

    def title(self) -> str:
        return f"{self.kind} {self.slot_count} slots {self.node} -> {self.target} (~{self.est_keys} keys)"


@frozen
class AssignSlots(Step):
    """Give node (a shard master) slots of its shard's share of the spec's layout that no master serves (ranges as
    text, e.g. "0-5461"; a cluster creation stopped part way leaves such slots): ADDSLOTSRANGE, then BUMPEPOCH."""

    kind: ClassVar[str] = "assign-slots"
    slots: str = ""
    slot_count: int = 0

    def title(self) -> str:
        return f"{self.kind} {self.slot_count} slots -> {self.node}"


@frozen
class CloseSlots(Step):
    """Close open slots: those a killed run journaled exactly as journaled, then any other open slot."""

    kind: ClassVar[str] = "close-slots"
    slots: str = ""

    def title(self) -> str:
        return f"{self.kind} {self.slots}"


@frozen
class RemoveNode(Step):
    """Stop a node the spec no longer has, then forget it on every other node (purge: delete its data too)."""

    kind: ClassVar[str] = "remove-node"
    purge: bool = False


@frozen
class SentinelReset(Step):
    """SENTINEL RESET on every running sentinel, one at a time, each waited for until it knows the fleet again:
    stopped replicas and sentinels are forgotten while the others keep a quorum."""

    kind: ClassVar[str] = "sentinel-reset"


@frozen
class ForgetNodes(Step):
    """CLUSTER FORGET of dead nodes' ids on every running node, until none knows them (a dead host replaced)."""

    kind: ClassVar[str] = "forget-nodes"
    ids: tuple[str, ...] = ()


@frozen
class PromoteReplica(Step):
    """CLUSTER FAILOVER <mode> on node, a replica of a master gone with its host (id dead, at endpoint was): TAKEOVER
    while the masters that answer are no majority (the cluster cannot elect it), FORCE while they are one but the
    replica's link has been down past the time it asks for an election (a vote, without the data-age check). Done
    once node answers as a master and a majority of the serving masters' views give it slots (ranges as text, e.g.
    "0-4095")."""

    kind: ClassVar[str] = "promote-replica"
    shard: int = 0
    dead: str = ""
    was: str = ""
    slots: str = ""
    mode: str = "takeover"  # one of PROMOTE_MODES

    def title(self) -> str:
        return f"{self.kind} {self.node} (shard {self.shard}, in place of {self.was})"


PROMOTE_MODES = ("takeover", "force")  # CLUSTER FAILOVER's options a promote-replica step may send


# Steps that touch their own node only: apply runs a run of them side by side, so their order inside it is free.
NODE_LOCAL = (WriteConfig, StartNode)

@frozen
class StartExporter(Step):
    """(Re)start the node's redis_exporter with the settings of digest (metrics.exporter), its ACL user set first."""

    kind: ClassVar[str] = "start-exporter"
    digest: str = ""


@frozen
class StopExporter(Step):
    kind: ClassVar[str] = "stop-exporter"


STEP_TYPES: dict[str, type[Step]] = {cls.kind: cls for cls in (
    WriteConfig, StartNode, StopNode, RestartNode, ConfigSet, FormCluster, JoinCluster, Replicate,
    SentinelMonitor, WaitConverged, MoveSlots, AssignSlots, CloseSlots, RemoveNode, Failover, SentinelSet, AclLoad,
    StartExporter, StopExporter,
    FinishFailover, SetPasswords, SentinelReset, ForgetNodes, PromoteReplica)}


@frozen
class Plan(Frozen):
    spec_name: str
    spec_digest: str
    fingerprint: str
    steps: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    replan: bool = False  # these steps come first: apply observes again after them and plans the rest
    summary: str = ""  # one line of counts: "3 to add, 1 to fail over, 2 to retire, 4 unchanged"

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict[str, Any]:
        return {"format": 1, "spec": self.spec_name, "spec_digest": self.spec_digest,
                "fingerprint": self.fingerprint, "steps": [s.to_dict() for s in self.steps],
                "notes": list(self.notes), "warnings": list(self.warnings), "replan": self.replan,
                **({"summary": self.summary} if self.summary else {})}
