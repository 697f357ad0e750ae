"""The apply operation: plan, run, and plan again while a plan started down nodes first (at most REPLANS rounds,
one more when a node it saw running stopped since), then the closing look, settled. Library code: it never
prints, asks or exits; approval is options.approve, what happens goes to emit."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import ClassVar

from opsctl.apply.planfile import SavedPlan
from opsctl.apply.planning import compute_plan
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Event, ignore
from opsctl.base.frozen import Frozen, frozen
from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import Plan
from opsctl.runtime.opening import Runtime
from opsctl.status.looks import StatusOptions, StatusResult, status


@frozen
class RoundDone(Frozen, Event):
    """A round of apply ran its plan's steps (wall time: steps run side by side)."""

    kind: ClassVar[str] = "round-done"
    steps: int
    seconds: float

    def line(self) -> str:
        return f"Applied {self.steps} step(s) in {self.seconds:.2f}s."


@frozen
class Replanning(Frozen, Event):
    """Nodes that ran when apply looked are down now (a node told to stop before, by a run killed mid-restart, may
    answer until it acts on it): apply plans again."""

    kind: ClassVar[str] = "replanning"
    nodes: tuple[str, ...]

    def line(self) -> str:
        return f"{', '.join(self.nodes)} ran when apply looked and is down now: planning again"


Approve = Callable[[Plan], None]  # sees each plan before it runs (raises RefusedError to say no)

REPLANS = 4  # down shard masters started first (planner._start_first), a killed run repaired (_repairs_first),
# open slots closed (the moves are planned once nothing is open), the rest
SETTLE_SECONDS = 10.0  # how long apply's closing look waits for what the servers settle on their own (gossip takes
# about node_timeout / 2 to reach every node; a replica's first ACK, 1 s), before "not healthy"
SENTINEL_SETTLE_SECONDS = 20.0  # Sentinel also ends a failover it runs: a live old master is converted to a replica
# 8 s (4 hello periods) after the switch


def approve_all(plan: Plan) -> None:
    """An Approve that lets every plan run (a library caller that decided before)."""


@frozen
class ApplyOptions(Frozen):
    """saved: apply this saved plan (refused, StalePlan, when it moved). dry_run: plan only, change nothing.
    allow_downtime, parallel_shards (1..16384), wait_timeout: the rollout's (apply.executor.execute). settle: how
    long the closing look waits to be healthy (None: SETTLE_SECONDS, SENTINEL_SETTLE_SECONDS under Sentinel).
    approve: called with every plan before it runs, an empty one or a dry run's too (the CLI prints each there,
    and asks for one with steps)."""

    saved: SavedPlan | None = None
    dry_run: bool = False
    allow_downtime: bool = False
    parallel_shards: int = 1
    wait_timeout: float = 60.0
    settle: float | None = None
    approve: Approve = approve_all


@frozen
class Round(Frozen):
    """A plan and what running it took: each step's title and seconds, and the wall time (steps run side by
    side)."""

    plan: Plan
    timings: tuple[tuple[str, float], ...] = ()
    seconds: float = 0.0


@frozen
class ApplyResult(Frozen):
    """rounds: each plan made and run. status: the closing look, settled (None in a dry run or when review is
    set). review: what the nodes a saved plan started call for, never reviewed: not run (a new plan is due)."""

    spec: str
    rounds: tuple[Round, ...]
    status: StatusResult | None = None
    review: Plan | None = None

    @property
    def steps_run(self) -> int:
        return sum(len(r.timings) for r in self.rounds)

    @property
    def healthy(self) -> bool:
        return self.status is not None and self.status.healthy

    @property
    def changes(self) -> bool:
        """A dry run's plan has steps, or a saved plan's rest needs a review."""
        return self.review is not None or (self.status is None and not self.rounds[-1].plan.empty)


DEFAULTS = ApplyOptions()


def apply(rt: Runtime, options: ApplyOptions = DEFAULTS, emit: Emit = ignore) -> ApplyResult:
    """Make rt's running topology match its spec, and look at it once it settled. A dry run returns the plan the
    first round would run (a saved one checked against the live state) and changes nothing."""
    name = rt.loaded.spec.name
    current, facts = compute_plan(rt, emit)
    if options.dry_run:
        planned = current if options.saved is None else options.saved.checked(current)
        options.approve(planned)
        return ApplyResult(name, (Round(planned),))
    _follow_playbooks(rt, emit)
    rounds: list[Round] = []
    try:
        review = _rounds(rt, options, emit, current, facts, rounds)
    except OpsctlError as exc:  # a plan made after another one ran (a replan) refused: changed all the same
        from opsctl.apply.executor import changed_anyway

        raise changed_anyway(exc, sum(len(r.timings) for r in rounds)) from None
    if review is not None:
        return ApplyResult(name, tuple(rounds), review=review)
    sentinel = rt.loaded.spec.topology == "sentinel"
    settle = options.settle if options.settle is not None else SENTINEL_SETTLE_SECONDS if sentinel else SETTLE_SECONDS
    return ApplyResult(name, tuple(rounds), status(rt, StatusOptions(settle=settle)))


def _rounds(rt: Runtime, options: ApplyOptions, emit: Emit, current: Plan, facts: Mapping[str, NodeFacts],
            rounds: list[Round]) -> Plan | None:
    """Plan and run (into rounds); again while a plan started down nodes first (replan) or a node it saw running
    stopped. Returns a saved plan's rest when it needs a review (then nothing more runs)."""
    saved = options.saved
    plan = current if saved is None else replace(saved.checked(current), replan=current.replan)
    for _ in range(REPLANS):
        rounds.append(run_plan(rt, plan, options, emit))
        if not plan.replan:
            break
        plan, facts = compute_plan(rt, emit)  # the nodes it started run now: plan the rest from what they say
        if saved is not None and plan.steps:
            return plan
    stopped = _stopped_since(rt, facts) if saved is None else []
    if stopped:
        emit(Replanning(tuple(stopped)))
        plan, facts = compute_plan(rt, emit)
        rounds.append(run_plan(rt, plan, options, emit))
    if not plan.replan and rt.loaded.spec.topology == "cluster":
        from opsctl.slots.journal import Journal

        Journal(rt.state_dir).filled()  # its last plan moved every shard it was filling to its share
    return None


def run_plan(rt: Runtime, plan: Plan, options: ApplyOptions, emit: Emit = ignore) -> Round:
    """One round: plan, approved, run with the rollout options (nothing for an empty plan or a dry run)."""
    from opsctl.apply.executor import execute

    options.approve(plan)
    if plan.empty or options.dry_run:
        return Round(plan)
    began = time.monotonic()
    timings = execute(rt, plan, emit, allow_downtime=options.allow_downtime,
                      parallel_shards=options.parallel_shards, wait_timeout=options.wait_timeout)
    seconds = time.monotonic() - began
    emit(RoundDone(len(plan.steps), seconds))
    return Round(plan, tuple(timings), seconds)


def _follow_playbooks(rt: Runtime, emit: Emit) -> None:
    """An Ansible provider's playbook tasks go to emit, on the steps' progress line."""
    if rt.loaded.spec.provider != "ansible":
        return  # its module is loaded for the specs that use it only
    from opsctl.providers.ansible import AnsibleProvider

    if isinstance(rt.provider, AnsibleProvider):
        rt.provider.on_event = emit


def _stopped_since(rt: Runtime, facts: Mapping[str, NodeFacts]) -> list[str]:
    """The spec's nodes that ran when the last plan was made and run no more (no plan leaves one stopped)."""
    from opsctl.net.fanout import fan_out

    nodes = [n for n in rt.loaded.layout.nodes if n.name in facts and facts[n.name].running]
    states = fan_out(rt.provider.process_state, nodes)
    return [n.name for n, state in zip(nodes, states, strict=True) if not state.running]
