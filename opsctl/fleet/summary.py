"""Each topology of a fleet through one library operation, at most `parallel` at once (a topology that fails is
an Outcome with its error, the others still run), and one summary of them: one line per topology and a total as
text; as JSON one envelope whose `topologies` list holds each the result the single-topology command gives (or its
error)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from opsctl.base.errors import OpsctlError
from opsctl.base.events import plural

if TYPE_CHECKING:
    from opsctl.apply.planning import PlanResult
    from opsctl.spec.load import LoadedSpec


class Shown(Protocol):
    """What a single-topology operation returns: text for people, an object for JSON."""

    def text(self) -> str: ...

    def to_dict(self) -> Mapping[str, object]: ...


R = TypeVar("R", bound=Shown)


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """One topology's result, or why it has none (error, and how to go on: hint)."""

    name: str
    result: R | None
    error: str | None = None
    hint: str | None = None

    @property
    def failed(self) -> bool:
        return self.result is None

    def to_dict(self) -> dict[str, object]:
        if self.result is None:
            return {"name": self.name, "error": self.error, "hint": self.hint}
        return {"name": self.name, **self.result.to_dict()}


@dataclass(frozen=True)
class FleetResult(Generic[R]):
    """command: plan, apply, status, destroy, validate; outcomes in the fleet's order."""

    command: str
    outcomes: tuple[Outcome[R], ...]

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outcomes if o.failed)

    def text(self) -> str:
        width = max(len(o.name) for o in self.outcomes)
        lines = [f"{o.name:<{width}}  {outcome_line(o)}" for o in self.outcomes]
        return "\n".join([*lines, self.total()])

    def total(self) -> str:
        n = len(self.outcomes)
        bad = len(self.failed)
        tail = f", {bad} failed ({', '.join(self.failed)})" if bad else ""
        return f"{self.command}: {plural(n, 'topology', 'topologies')}{tail}"

    def to_dict(self) -> dict[str, object]:
        return {"command": self.command, "failed": list(self.failed),
                "topologies": [o.to_dict() for o in self.outcomes]}


def outcome_line(outcome: Outcome[R]) -> str:
    """The topology's line: what failed, or what its result says in one line."""
    if outcome.result is None:
        hint = f" (hint: {outcome.hint})" if outcome.hint else ""
        return f"FAILED: {outcome.error}{hint}"
    return result_line(outcome.result)


def result_line(result: Shown) -> str:
    """One line for a single command's result: a plan's steps, an apply's steps and health, a status's health (and
    a standby's link), a destroy's nodes; else the first line of its text."""
    from opsctl.apply.planning import PlanResult
    from opsctl.destroy.teardown import DestroyResult
    from opsctl.status.looks import StatusResult

    if isinstance(result, PlanResult):
        return plan_line(result)
    if isinstance(result, StatusResult):
        return result.health + (f"; {result.standby.line()}" if result.standby else "")
    if isinstance(result, DestroyResult):
        verb = "would stop" if result.dry_run else "stopped"
        return f"{verb} {plural(len(result.nodes), 'node')}" + (" (purged)" if result.purge else "")
    return result.text().splitlines()[0] if result.text() else ""


def plan_line(result: PlanResult) -> str:
    plan = result.plan
    if plan.empty:
        return "no changes"
    return f"{plural(len(plan.steps), 'step')}" + (f": {plan.summary}" if plan.summary else "")

PARALLEL = 4  # --parallel's default


def run_each(fn: Callable[[LoadedSpec], R], specs: Sequence[LoadedSpec], parallel: int = PARALLEL
             ) -> list[Outcome[R]]:
    """fn for each spec, at most parallel at once, each outcome in specs' order."""
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(specs))), thread_name_prefix="fleet") as pool:
        return list(pool.map(lambda loaded: one(fn, loaded), specs))


def one(fn: Callable[[LoadedSpec], R], loaded: LoadedSpec) -> Outcome[R]:
    """fn(loaded), its error kept (an OpsctlError as it renders; anything else by its type and message)."""
    name = loaded.spec.name
    try:
        return Outcome(name, fn(loaded))
    except OpsctlError as exc:
        return Outcome(name, None, exc.summary, exc.hint)
    except Exception as exc:
        return Outcome(name, None, f"{type(exc).__name__}: {exc}")
