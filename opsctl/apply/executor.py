"""Run a plan's steps through the provider and admin connections; after each mutation, look again.

The run loop: node-local steps (write, start) of different nodes run in waves side by side, every other step alone
and in order; the first failure stops the plan with an error naming the step. What each step does is in its
family's module: node_steps, replication_steps, shape_steps, cluster_steps (and the slot steps it hands to
slot_steps), and metrics' exporter_steps; each handler takes its exact step type and is registered by it in
HANDLERS (runtime.execution.handles), all but StartNode's: a wave's starts run together (_start_together)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

from opsctl.apply.cluster_steps import (
    assign_slots,
    close_slots,
    form,
    join_cluster,
    move_slots,
    remove_node,
    wait_converged,
)
from opsctl.apply.node_steps import (
    acl_load,
    after_start,
    config_set,
    restart_node,
    set_passwords,
    stop_node,
    wait_answering,
    write_config,
)
from opsctl.apply.replication_steps import do_replicate, fail_over, finish_failover, sentinel_monitor, sentinel_set
from opsctl.apply.shape_steps import forget_nodes, promote_replica, sentinel_reset
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, Event
from opsctl.base.frozen import Frozen, frozen
from opsctl.metrics.exporter_steps import start_exporter, stop_exporter
from opsctl.net.fanout import Borrowed
from opsctl.net.topolock import check_held, mark_started
from opsctl.plan.steps import (
    NODE_LOCAL,
    AclLoad,
    AssignSlots,
    CloseSlots,
    ConfigSet,
    Failover,
    FinishFailover,
    ForgetNodes,
    FormCluster,
    JoinCluster,
    MoveSlots,
    Plan,
    PromoteReplica,
    RemoveNode,
    Replicate,
    RestartNode,
    SentinelMonitor,
    SentinelReset,
    SentinelSet,
    SetPasswords,
    StartExporter,
    StartNode,
    Step,
    StopExporter,
    StopNode,
    WaitConverged,
    WriteConfig,
)
from opsctl.runtime.execution import Execution, StepHandler, handles, registry
from opsctl.runtime.opening import Runtime


@frozen
class StepStart(Frozen, Event):
    kind: ClassVar[str] = "step-start"
    index: int
    total: int
    step: str

    def line(self) -> str:
        return f"[{self.index}/{self.total}] {self.step} ..."


@frozen
class StepDone(Frozen, Event):
    kind: ClassVar[str] = "step-done"
    index: int
    step: str
    seconds: float

    def line(self) -> str:
        return f"[{self.index}] done in {self.seconds:.2f}s"


@frozen
class StepFailed(Frozen, Event):
    """The error itself is printed once, by the CLI, when the run stops."""

    kind: ClassVar[str] = "step-failed"
    index: int
    step: str
    error: str

    def line(self) -> str:
        return f"[{self.index}] failed"


def execute(rt: Runtime, plan: Plan, emit: Emit, allow_downtime: bool = False,
            parallel_shards: int = 1, wait_timeout: float = 60.0) -> list[tuple[str, float]]:
    """Run every step in order (node-local write/start steps of different nodes in parallel waves);
    stop at the first failure with an error naming the step. parallel_shards > 1 rolls that many shards
    at once through a plan of restarts and failovers."""
    _refuse_downtime(plan, allow_downtime)
    run = Execution(rt, emit, allow_downtime, wait_timeout, plan)
    numbered = list(enumerate(plan.steps, start=1))
    if parallel_shards > 1 and all(isinstance(s, (RestartNode, Failover, WaitConverged)) for s in plan.steps):
        _run_shards_in_parallel(run, numbered, parallel_shards)
        return run.timings
    planned = waves(numbered)
    # waited for on the way out, also when a step failed; the shared pool starts a thread when none is idle, so the
    # replicas' wave never waits behind the fan-outs of the steps it runs beside
    with Borrowed() as beside:
        for wave, following in zip(planned, [*planned[1:], None], strict=True):
            if len(wave) == 1 and not isinstance(wave[0][0][1], NODE_LOCAL):
                _run_chain(run, wave[0], len(plan.steps))
                continue
            now, later = _masters_first(run, wave, following)

            def launched(later: list[list[tuple[int, Step]]] = later) -> None:
                run.replicas_starting = beside.submit(_run_wave, run, later, len(plan.steps))

            _run_wave(run, now, len(plan.steps), launched if later else None)
    return run.timings


Chain = list[tuple[int, Step]]


def _masters_first(run: Execution, wave: list[Chain], following: list[Chain] | None) -> tuple[list[Chain], list[Chain]]:
    """A node-local wave as (what runs now, what runs beside once the masters were launched). Before a form-cluster
    step the replicas' chains run beside, and form-cluster waits for them once the masters are set up and meet; a
    provider that stages files writes the replicas' files now, to ship them in the masters' playbook.
    Why: a master's writable delay runs from its own start, so the rest overlaps it."""
    if following is None or not isinstance(following[0][0][1], FormCluster):
        return wave, []
    layout = run.rt.loaded.layout
    replicas = [chain for chain in wave if layout.node(chain[0][1].node).role != "master"]
    masters = [chain for chain in wave if chain not in replicas]
    if not run.rt.provider.stages_files:
        return masters, replicas
    writes = [[s for s in chain if not isinstance(s[1], StartNode)] for chain in replicas]
    starts = [[s for s in chain if isinstance(s[1], StartNode)] for chain in replicas]
    return masters + [c for c in writes if c], [c for c in starts if c]



def waves(numbered: list[tuple[int, Step]]) -> list[list[list[tuple[int, Step]]]]:
    """Split steps into waves; a wave of node-local steps holds one chain per node, run side by side."""
    result: list[list[list[tuple[int, Step]]]] = []
    chains: dict[str, list[tuple[int, Step]]] = {}
    for index, step in numbered:
        if isinstance(step, NODE_LOCAL):
            chains.setdefault(step.node, []).append((index, step))
            continue
        if chains:
            result.append(list(chains.values()))
            chains = {}
        result.append([[(index, step)]])
    if chains:
        result.append(list(chains.values()))
    return result


def _run_shards_in_parallel(run: Execution, numbered: list[tuple[int, Step]], width: int) -> None:
    """Shard groups side by side (each group in order), then whatever belongs to no shard."""
    groups: dict[int, list[tuple[int, Step]]] = {}
    for index, step in numbered:
        groups.setdefault(getattr(step, "shard", 0), []).append((index, step))
    rest = groups.pop(0, [])
    total = len(numbered)
    # a pool of its own: `width` (--parallel-shards) bounds the shards rolled at once, which fan_out's fixed width
    # cannot; every group runs to its end or its first failure, as one submitted to this pool always has
    with ThreadPoolExecutor(max_workers=width) as pool:
        futures = [pool.submit(_run_chain, run, chain, total) for chain in groups.values()]
    errors = [exc for f in futures if (exc := f.exception()) is not None]
    if errors:
        raise errors[0]
    _run_chain(run, rest, total)


def _run_wave(run: Execution, wave: list[list[tuple[int, Step]]], total: int,
              launched: Callable[[], None] | None = None) -> None:
    """All config writes first (a staging provider ships them in one go), then every start at once; launched is
    called once every node was launched (or at the end, when none was to start). The StartNode steps run here, not
    through HANDLERS."""
    steps = [s for chain in wave for s in chain]
    _run_chain(run, [s for s in steps if isinstance(s[1], WriteConfig)], total)
    starts = [(index, step) for index, step in steps if isinstance(step, StartNode)]
    if starts:
        _start_together(run, starts, total, launched)
    elif launched is not None:
        launched()


def _start_together(run: Execution, starts: list[tuple[int, StartNode]], total: int,
                    launched: Callable[[], None] | None = None) -> None:
    """The provider launches every node at once and waits for them in one loop, then one loop waits until all
    answer PING; each step is done or failed on its own, and the first failure stops the plan."""
    check_held(run.rt.connector)  # as before each step: a run that lost its topology lock starts nothing
    began = time.monotonic()
    for index, step in starts:
        run.emit(StepStart(index, total, step.title()))
    nodes = [run.node(step) for _, step in starts]
    # masters first: a new cluster is ok once its last master's writable delay ran out, however late its replicas
    # start
    failed = run.rt.provider.start_many(sorted(nodes, key=lambda n: n.role != "master"), launched)
    failed |= wait_answering(run, [n for n in nodes if n.name not in failed])
    mark_started(run.rt.connector, [n.name for n in nodes if n.name not in failed])  # a lost lock raises here
    errors: list[OpsctlError] = []
    for index, step in starts:
        try:
            if step.node in failed:
                raise failed[step.node]
            check_held(run.rt.connector)  # the starts and waits took a while: each node's next change checks
            after_start(run, step)
        except OpsctlError as exc:
            run.emit(StepFailed(index, step.title(), exc.summary))
            exc.summary = f"step {index}/{total} ({step.title()}) failed: {exc.summary}"
            errors.append(changed_anyway(exc, len(run.timings)))
            continue
        elapsed = time.monotonic() - began
        run.timings.append((step.title(), elapsed))
        run.emit(StepDone(index, step.title(), round(elapsed, 3)))
    if errors:
        raise errors[0]


def _run_chain(run: Execution, chain: list[tuple[int, Step]], total: int) -> None:
    for index, step in chain:
        _run_step(run, index, total, step)


def changed_anyway(exc: OpsctlError, steps_done: int) -> OpsctlError:
    """A refusal (exit 3: nothing was changed) once steps_done steps ran is an error (exit 1) that says so:
    a pipeline must not take the topology for untouched."""
    if not isinstance(exc, RefusedError) or steps_done == 0:
        return exc
    hint = "; ".join(part for part in (exc.hint, "apply again plans from the state now") if part)
    return OpsctlError(f"{exc.summary} (after {steps_done} step(s) of this run had changed the topology)",
                       exc.detail, hint)


def _run_step(run: Execution, index: int, total: int, step: Step) -> None:
    check_held(run.rt.connector)  # a run that lost its topology lock stops before its next change
    run.emit(StepStart(index, total, step.title()))
    started = time.monotonic()
    try:
        HANDLERS[type(step)].run_step(run, step)
    except OpsctlError as exc:
        run.emit(StepFailed(index, step.title(), exc.summary))
        exc.summary = f"step {index}/{total} ({step.title()}) failed: {exc.summary}"
        raise changed_anyway(exc, len(run.timings)) from None
    elapsed = time.monotonic() - started
    run.timings.append((step.title(), elapsed))
    run.emit(StepDone(index, step.title(), round(elapsed, 3)))


def _refuse_downtime(plan: Plan, allow_downtime: bool) -> None:
    masters = [s.node for s in plan.steps if isinstance(s, RestartNode) and s.needs_downtime]
    if masters and not allow_downtime:
        raise RefusedError(f"the plan restarts master(s) {', '.join(masters)}, which stops their writes",
                           "fail the master over first (opsctl failover), so it restarts as a replica",
                           "or pass --allow-downtime to accept the write outage")


# every step type but StartNode, which _run_wave starts with the rest of its wave (_start_together)
HANDLERS: dict[type[Step], StepHandler] = registry(
    handles(WriteConfig, write_config), handles(StopNode, stop_node), handles(RestartNode, restart_node),
    handles(Failover, fail_over), handles(SentinelSet, sentinel_set), handles(FinishFailover, finish_failover),
    handles(ConfigSet, config_set), handles(AclLoad, acl_load), handles(SetPasswords, set_passwords),
    handles(FormCluster, form), handles(JoinCluster, join_cluster), handles(Replicate, do_replicate),
    handles(SentinelMonitor, sentinel_monitor), handles(WaitConverged, wait_converged),
    handles(MoveSlots, move_slots), handles(AssignSlots, assign_slots), handles(CloseSlots, close_slots),
    handles(RemoveNode, remove_node), handles(StartExporter, start_exporter), handles(StopExporter, stop_exporter),
    handles(SentinelReset, sentinel_reset), handles(ForgetNodes, forget_nodes),
    handles(PromoteReplica, promote_replica),
)
