"""A failover's plain data: its target, a check's verdict, the thresholds the checks use, a past failover from
its report, and how a check's value names a node's role. Pure."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from opsctl.base.errors import is_auth_failure
from opsctl.base.frozen import Frozen, frozen
from opsctl.plan.facts import NodeFacts
from opsctl.plan.health import MAX_LAG_BYTES
from opsctl.spec.layout import endpoint


@frozen
class Check(Frozen):
    name: str
    passed: bool
    value: str
    threshold: str = ""
    hint: str = ""
    binding: bool = False  # --force-checks cannot override it: what it guards is two masters taking writes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        limit = f" (want {self.threshold})" if self.threshold else ""
        return f"[{'pass' if self.passed else 'FAIL'}] {self.name}: {self.value}{limit}"


@frozen
class Thresholds(Frozen):
    max_lag_bytes: int = MAX_LAG_BYTES
    max_lag_seconds: int = 3
    cooldown_s: float = 10.0  # voters: no second vote about the same master within 2 x cluster-node-timeout
    retry_s: float = 20.0  # the candidate: no new election within 2 x max(2 s, 2 x cluster-node-timeout)


@frozen
class Target(Frozen):
    """The failover: shard, its master now, and the replica to promote (None: Sentinel chooses, or, with
    no_replica saying why, there is none to promote)."""

    shard: int
    master: str
    replica: str | None
    no_replica: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def promotion(self) -> str:
        """`m -> r`, `m -> chosen by Sentinel`, or `m -> none (why)`."""
        if self.replica:
            return f"{self.master} -> {self.replica}"
        return f"{self.master} -> " + (f"none ({self.no_replica})" if self.no_replica else "chosen by Sentinel")


@frozen
class PastFailover(Frozen):
    """A finished failover from an earlier report: when (epoch s) and which master it replaced."""

    finished: float
    old_master: str
    new_master: str
    interrupted: bool = False  # from the in-progress report of a killed run: finished is its deadline


def role_text(f: NodeFacts) -> str:
    role = f.role
    if not f.reachable or role is None:
        return "authentication failed" if is_auth_failure(f.error) else f"does not answer ({f.error or 'not running'})"
    if role.kind == "replica" and role.master:
        return f"replica of {endpoint(*role.master)}, link {role.link}"
    return role.kind
