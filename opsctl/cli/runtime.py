"""The Runtime a command runs on, opened from its -f/--state-dir options under the locks it asks for, and the
status it prints when done: one place for plan, apply, status, destroy and restart."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: `opsctl --help` imports no runtime module
    from opsctl.cli.results import StatusResult
    from opsctl.runtime.opening import Runtime


def _load(args: argparse.Namespace, cache_beside: bool = False) -> Runtime:
    from opsctl.cli.runsignals import note_run
    from opsctl.runtime.opening import make_runtime
    from opsctl.state.specfile import read_spec_to_keep

    state_dir = getattr(args, "state_dir", None)
    loaded, keep = read_spec_to_keep(args.file)
    if getattr(args, "rebalance_placement", False):  # `cluster rebalance --placement`: for this run only
        from opsctl.plan.spread import with_rebalancing

        loaded = with_rebalancing(loaded)
    note_run(args, loaded.spec.name)  # --metrics-textfile names it, however the run ends
    rt = make_runtime(loaded, state_dir)
    if cache_beside and state_dir is None:  # its state goes beside the spec: so does the validated spec
        keep()
    return rt


@contextmanager
def open_runtime(args: argparse.Namespace, locked: bool = False, cache_beside: bool = False) -> Iterator[Runtime]:
    """The runtime, under the state-dir lock and the topology lock if asked, for the whole run (planning
    included), so no other run changes the topology between the plan and its steps; its provider is closed inside
    the locks. cache_beside: keep the validated spec beside it even on a first run (plan and apply, a pipeline's
    pair). More: docs/internals.md."""
    rt = _load(args, cache_beside)
    with ExitStack() as locks:
        if locked:
            from opsctl.state.statelock import state_lock

            locks.enter_context(state_lock(rt.state_dir))
        try:
            if locked:
                from opsctl.net.topolock import topology_lock  # redis: plan and status import no client library

                locks.enter_context(topology_lock(rt.connector, nowhere=lambda names: runs_nowhere(rt, names),
                                                  force=args.force_lock))
            yield rt
        finally:
            rt.provider.close()


def runs_nowhere(rt: Runtime, names: Sequence[str]) -> list[str]:
    """Of the named servers (silent to the topology lock), those the provider finds running nowhere: not deployed
    yet or stopped, their host reached and no process of theirs there (a first apply, a topology stopped by
    `destroy`, a scale-out's new servers). They grant no run anything, on either side of a split, so the lock counts
    its majority among the others. A host the provider cannot reach may run a server opsctl cannot see: not such a
    server."""
    from opsctl.base.errors import OpsctlError
    from opsctl.net.fanout import fan_out

    def stopped(name: str) -> bool:
        try:
            return not rt.provider.process_state(rt.node(name)).running
        except OpsctlError:  # a host out of reach: a server may run there
            return False

    return [name for name, down in zip(names, fan_out(stopped, list(names)), strict=True) if down]


def print_status(rt: Runtime, output: str, settle: float = 0.0) -> bool:
    """Print the status; as text, how to get healthy on stderr when it is not. Returns whether it is healthy.
    settle: seconds an unhealthy look is looked at again (apply: what the servers finish on their own, a role
    gossiped, a replica's first ACK, a sentinel's replica reconfigured, is not a failed apply); a refused password
    is not waited for."""
    import time

    from opsctl.base.errors import AUTH_HINT
    from opsctl.cli.output import print_result

    deadline = time.monotonic() + settle
    status = status_result(rt)
    while not status.healthy and status.hint != AUTH_HINT and time.monotonic() < deadline:
        time.sleep(0.25)  # a look opens a connection per node: four a second is plenty for what gossip does
        status = status_result(rt)
    print_result(status, output)
    if output == "text" and status.hint is not None:
        print(f"  hint: {status.hint}", file=sys.stderr)
    return status.healthy


def status_result(rt: Runtime) -> StatusResult:
    """What status reports: one look at every node (no config read), the health line and its hint."""
    from dataclasses import replace

    from opsctl.cli.report import node_status
    from opsctl.cli.results import StatusResult
    from opsctl.plan.health import deployed_view, health_hint, health_line
    from opsctl.runtime.gather import gather_facts

    facts = gather_facts(rt, with_config=False)  # a look without the config still reads the write fence
    view, pending = deployed_view(rt.loaded.layout, facts)  # what runs; what the next apply adds is not down
    healthy, line = health_line(replace(rt.loaded, layout=view), facts)
    if pending:
        line += f"; to be added by the next apply: {', '.join(n.name for n in pending)}"
    return StatusResult(rt.loaded.spec.name, rt.loaded.spec.topology, healthy, line,
                        tuple(node_status(view, facts, pending)), None if healthy else health_hint(facts))
