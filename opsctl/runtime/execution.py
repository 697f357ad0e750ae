"""One run of a plan: what every step handler reads (the runtime, the plan, the options) and keeps (timings, what a
node had before this run touched it), and the typed dispatch of a step to its handler. Shared by the run loop
(executor, which holds the HANDLERS registry) and the step families beside it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from opsctl.base.events import Emit
from opsctl.base.frozen import Frozen, frozen
from opsctl.plan.steps import ConfigSet, Plan, RestartNode, Step
from opsctl.runtime.opening import Runtime
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.layout import Node


@dataclass
class Before:
    """What a node had before this run touched it, to roll back a live change the server refused."""

    files: dict[str, str | None]
    record: NodeRecord
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
        return self.before.setdefault(node, Before({}, NodeRecord())).config

    def restarts(self, node: str) -> bool:
        return any(isinstance(s, RestartNode) and s.node == node for s in (self.plan.steps if self.plan else ()))


S = TypeVar("S", bound=Step)


@frozen
class Handler(Frozen, Generic[S]):
    """A step family's handler of one step type, which it takes exactly: handles() pairs them, and mypy checks that
    the function accepts that type."""

    step_type: type[S]
    do: Callable[[Execution, S], None]

    def run_step(self, run: Execution, step: Step) -> None:
        """The dispatch's one type check: the step is of the type this handler was registered for."""
        if not isinstance(step, self.step_type):
            raise TypeError(f"a {type(step).__name__} step was dispatched to the {self.step_type.__name__} handler")
        self.do(run, step)


class StepHandler(Protocol):
    """A Handler of any step type, as a registry holds it."""

    @property
    def step_type(self) -> type[Step]: ...

    def run_step(self, run: Execution, step: Step) -> None: ...


def handles(step_type: type[S], do: Callable[[Execution, S], None]) -> StepHandler:
    """do as the handler of step_type: mypy checks here that do takes a step_type (from these two arguments alone,
    as the return type does not name S)."""
    return Handler(step_type, do)


def registry(*handlers: StepHandler) -> dict[type[Step], StepHandler]:
    """Handlers by their step type; a step type handled twice is a mistake in the registry."""
    by_type = {handler.step_type: handler for handler in handlers}
    if len(by_type) != len(handlers):
        names = [handler.step_type.__name__ for handler in handlers]
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"step type(s) handled twice: {', '.join(twice)}")
    return by_type
