"""One run of a plan: what every step handler reads (the runtime, the plan, the options) and keeps (timings, what a
node had before this run touched it). Shared by the run loop (executor) and the step families beside it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from opsctl.base.events import Emit
from opsctl.plan.steps import ConfigSet, Plan, RestartNode, Step
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node


@dataclass
class Before:
    """What a node had before this run touched it, to roll back a live change the server refused."""

    files: dict[str, str | None]
    record: dict[str, Any]
    config: list[tuple[str, str]] = field(default_factory=list)  # (directive, value before CONFIG SET)


@dataclass
class Execution:
    rt: Runtime
    emit: Emit
    allow_downtime: bool = False
    wait_timeout: float = 60.0
    plan: Plan | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)
    before: dict[str, Before] = field(default_factory=dict)  # per node: its files and record before this run
    replicas_starting: Future[None] | None = None  # a new cluster's replicas, written and started beside it

    def node(self, step: Step) -> Node:
        """The spec's node a step acts on."""
        return self.rt.node(step.node)

    def sets_live(self, node: str) -> bool:
        """Does the plan CONFIG SET on this node? Then its files are kept to roll a refused value back."""
        return any(isinstance(s, ConfigSet) and s.node == node for s in (self.plan.steps if self.plan else ()))

    def undo_list(self, node: str) -> list[tuple[str, str]]:
        return self.before.setdefault(node, Before({}, {})).config

    def restarts(self, node: str) -> bool:
        return any(isinstance(s, RestartNode) and s.node == node for s in (self.plan.steps if self.plan else ()))
