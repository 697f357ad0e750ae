"""plan, apply, status, destroy: the main job."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from opsctl.base.errors import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, OpsctlError, RefusedError
from opsctl.cli.options import (
    SECONDS,
    add_auto_approve,
    add_dry_run,
    add_force_lock,
    add_metrics_textfile,
    add_spec_options,
    confirm,
    ranged,
)
from opsctl.cli.runsignals import recorded
from opsctl.cli.runtime import open_runtime, print_status

if TYPE_CHECKING:  # annotations only: `opsctl --help` imports no runtime, plan or facts module
    from pathlib import Path

    from opsctl.base.events import Emit
    from opsctl.cli.output import Lines
    from opsctl.plan.facts import NodeFacts
    from opsctl.plan.steps import Plan
    from opsctl.runtime.opening import Runtime
    from opsctl.spec.layout import Node


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from opsctl.apply.planning import compute_plan
    from opsctl.cli.output import print_result
    from opsctl.cli.results import PlanResult
    from opsctl.state.safefs import check_writable_target, write_private

    if args.out:
        check_writable_target(args.out, "--out")
    with open_runtime(args, cache_beside=True) as rt:
        plan, _ = compute_plan(rt)
    if args.out:
        from pathlib import Path

        write_private(Path(args.out), json.dumps(plan.to_dict(), indent=2) + "\n")
    print_result(PlanResult(plan), args.output)
    return EXIT_OK if plan.empty else EXIT_CHANGES


def _saved_plan(path: str, saved: Plan, current: Plan) -> Plan:
    if saved.spec_digest != current.spec_digest:
        raise RefusedError("the spec changed since the plan was made", f"plan: {path}",
                           "run opsctl plan --out again and review it")
    if saved.fingerprint != current.fingerprint:
        raise RefusedError("the live topology changed since the plan was made", f"plan: {path}",
                           "run opsctl plan --out again and review it")
    if saved.steps != current.steps:
        raise RefusedError("the saved plan's steps differ from what opsctl would do now", f"plan: {path}",
                           "run opsctl plan --out again and review it")
    return saved


def run_plan(rt: Runtime, plan: Plan, args: argparse.Namespace, question: str, done: str) -> int:
    """Show the plan; unless it is empty, confirm and execute it with the rollout options. Returns the number of
    steps that ran."""
    from opsctl.apply.executor import execute
    from opsctl.cli.output import print_result, printing
    from opsctl.cli.results import PlanResult

    print_result(PlanResult(plan), args.output)
    if plan.empty or args.dry_run:
        return 0
    confirm(args, question)
    with printing(args.output == "json") as emit:
        _follow_playbooks(rt, emit)
        began = time.monotonic()
        timings = execute(rt, plan, emit, allow_downtime=args.allow_downtime, parallel_shards=args.parallel_shards,
                          wait_timeout=args.wait_timeout)
    print(f"{done} in {time.monotonic() - began:.2f}s.", file=sys.stderr)  # wall time: steps run side by side
    return len(timings)


def _follow_playbooks(rt: Runtime, emit: Emit) -> None:
    """An Ansible provider's playbook tasks print through emit, on the steps' progress line."""
    if rt.loaded.spec.provider != "ansible":
        return  # its module is loaded for the specs that use it only
    from opsctl.providers.ansible import AnsibleProvider

    if isinstance(rt.provider, AnsibleProvider):
        rt.provider.on_event = emit


def rollout_options(parser: argparse.ArgumentParser, downtime_help: str) -> None:
    """The options of every command that executes a plan which may restart or fail over nodes."""
    add_auto_approve(parser)
    add_force_lock(parser)
    add_dry_run(parser, "print the plan, change nothing (no lock, nothing written)")
    parser.add_argument("--allow-downtime", action="store_true", help=downtime_help)
    parser.add_argument("--parallel-shards", type=ranged(int, 1, 16384), default=1, metavar="N",
                        help="roll restarts through N shards at once")
    parser.add_argument("--wait-timeout", type=SECONDS, default=60.0, metavar="S",
                        help="how long a restarted node may take to be back in place, or a failover's checks to pass")


SETTLE_SECONDS = 10.0  # how long apply's closing look waits for what the servers settle on their own (gossip takes
# about node_timeout / 2 to reach every node; a replica's first ACK, 1 s), before "not healthy"
SENTINEL_SETTLE_SECONDS = 20.0  # Sentinel also ends a failover it runs: a live old master is converted to a replica
# 8 s (4 hello periods) after the switch

WATCH_SECONDS = ranged(float, 0.5, 3600.0)  # status --watch: faster than 0.5 s is a load, not a view

REPLANS = 4  # down shard masters started first (planner._start_first), a killed run repaired (_repairs_first),
# open slots closed (the moves are planned once nothing is open), the rest


def cmd_apply(args: argparse.Namespace) -> int:
    from opsctl.apply.planfile import read_saved_plan

    saved = read_saved_plan(args.plan) if args.plan else None  # a bad file is refused before anything is done
    if args.dry_run:
        return _apply_dry_run(args, saved)
    with open_runtime(args, locked=True, cache_beside=True) as rt:
        if _apply_plans(rt, args, saved) < 0:
            return EXIT_CHANGES
        settle = SENTINEL_SETTLE_SECONDS if rt.loaded.spec.topology == "sentinel" else SETTLE_SECONDS
        healthy = print_status(rt, args.output, settle=settle)
    if not healthy:
        raise OpsctlError("apply finished, but the topology is not healthy (see the status above)",
                          hint="apply again once the node named above answers; `opsctl status` shows every node")
    return EXIT_OK


def _apply_dry_run(args: argparse.Namespace, saved: Plan | None) -> int:
    """The plan apply would run first (a saved one checked against the live state), as plan prints it; exit 2 when
    it has steps. No lock is taken and nothing is written."""
    from opsctl.apply.planning import compute_plan
    from opsctl.cli.output import print_result
    from opsctl.cli.results import PlanResult

    with open_runtime(args) as rt:
        plan, _ = compute_plan(rt)
    if saved is not None:
        plan = _saved_plan(args.plan, saved, plan)
    print_result(PlanResult(plan), args.output)
    return EXIT_OK if plan.empty else EXIT_CHANGES


def _apply_plans(rt: Runtime, args: argparse.Namespace, saved: Plan | None) -> int:
    """Plan and run; again while a plan started down nodes first (replan) or a node it saw running stopped.
    Returns the steps that ran, or -1 when a saved plan's rest needs a review (printed)."""
    from dataclasses import replace

    from opsctl.apply.planning import compute_plan

    ran = 0
    plan, facts = compute_plan(rt)
    if saved is not None:
        plan = replace(_saved_plan(args.plan, saved, plan), replan=plan.replan)
    try:
        for _ in range(REPLANS):
            ran += run_plan(rt, plan, args, f"Apply {len(plan.steps)} step(s) to '{plan.spec_name}'?",
                            f"Applied {len(plan.steps)} step(s)")
            if not plan.replan:
                break
            plan, facts = compute_plan(rt)  # the nodes it started run now: plan the rest from what they say
            if saved is not None and plan.steps:
                _rest_needs_review(args, plan)
                return -1
        stopped = _stopped_since(rt, facts) if saved is None else []
        if stopped:
            # a node told to stop before apply looked (a run killed mid-restart) may answer until it acts on it
            print(f"{', '.join(stopped)} ran when apply looked and is down now: planning again", file=sys.stderr)
            plan, facts = compute_plan(rt)
            ran += run_plan(rt, plan, args, f"Apply {len(plan.steps)} step(s) to '{plan.spec_name}'?",
                            f"Applied {len(plan.steps)} step(s)")
        if not plan.replan and rt.loaded.spec.topology == "cluster":
            from opsctl.slots.journal import Journal

            Journal(rt.state_dir).filled()  # its last plan moved every shard it was filling to its share
    except OpsctlError as exc:  # a plan made after another one ran (a replan) refused: changed all the same
        from opsctl.apply.executor import changed_anyway

        raise changed_anyway(exc, ran) from None
    return ran


def _stopped_since(rt: Runtime, facts: Mapping[str, NodeFacts]) -> list[str]:
    """The spec's nodes that ran when the last plan was made and run no more (no plan leaves one stopped)."""
    from opsctl.net.fanout import fan_out

    nodes = [n for n in rt.loaded.layout.nodes if n.name in facts and facts[n.name].running]
    states = fan_out(rt.provider.process_state, nodes)
    return [n.name for n, state in zip(nodes, states, strict=True) if not state.running]


def _rest_needs_review(args: argparse.Namespace, rest: Plan) -> int:
    """A saved plan runs exactly its own steps: when it started down nodes first (plan.replan), the steps their
    answers call for were never reviewed. They are shown, not run, and exit 2 says a new plan is due."""
    from opsctl.cli.report import plan_text

    print("The saved plan's steps are done. What the nodes it started now call for was not in it:", file=sys.stderr)
    print(plan_text(rest), file=sys.stderr)
    print(f"  hint: review them with opsctl plan -f {args.file} --out FILE, then apply that plan", file=sys.stderr)
    return EXIT_CHANGES


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 only when the topology is healthy: a node down, a refused password or a cluster not ok is 1."""
    with open_runtime(args) as rt:
        if args.watch is not None:
            from opsctl.cli.watch import watch_status

            return watch_status(rt, args.output, args.watch)
        healthy = print_status(rt, args.output)
    return EXIT_OK if healthy else EXIT_ERROR


def cmd_destroy(args: argparse.Namespace) -> int:
    from opsctl.cli.output import Lines, print_result
    from opsctl.cli.results import LinesResult

    _check_textfile_folder(args)
    say = Lines(args.output)
    with open_runtime(args) as rt:
        found = _destroy(rt, args, say)
    if say.json_mode:
        facts = (("name", rt.loaded.spec.name), ("dry_run", args.dry_run), ("purge", args.purge),
                 ("nothing_to_do", not found))
        print_result(LinesResult(tuple(say.lines), facts), "json")
    return EXIT_OK


def _destroy(rt: Runtime, args: argparse.Namespace, say: Lines) -> bool:
    """Stop (and with --purge delete) exactly the nodes that run, have an exporter running or have files, and say so
    node by node: every node the state knows (_destroy_order), so a purge leaves nothing of the topology and the next
    apply deploys as the first did. A topology with nothing to do is left alone: no question, no lock, nothing
    written (a lock file would be a lie of 'deployed'); a dry run prints what would be done and changes nothing
    either. Returns whether there was any."""
    from opsctl.cli.runtime import runs_nowhere
    from opsctl.metrics.exporter_steps import remove_exporter
    from opsctl.net.topolock import check_held, stopping, topology_lock
    from opsctl.state.statelock import state_lock

    todo = [p for p in _presence(rt, _destroy_order(rt)) if p.running or p.exporter or (args.purge and p.files)]
    name = rt.loaded.spec.name
    if not todo or args.dry_run:
        for p in todo:
            say(_destroy_words(p.node.name, p.running, args.purge and p.files, p.exporter, dry_run=True))
        if not todo:
            say(f"nothing to {'stop or purge' if args.purge else 'stop'}: no node of '{name}' runs"
                f"{' or has files' if args.purge else ''}")
        if args.purge:  # a purge killed after its last node left the journals: they go on this path too
            _purge_state(rt.state_dir, args.dry_run, say)
        _drop_textfiles(args, name, say)
        return bool(todo)
    what = "stop every node and DELETE its data" if args.purge else "stop every node (data is kept)"
    confirm(args, f"This will {what} of '{name}'.")
    with state_lock(rt.state_dir), topology_lock(rt.connector, nowhere=lambda names: runs_nowhere(rt, names),
                                                           force=args.force_lock):
        for p in todo:
            check_held(rt.connector)
            running = rt.provider.process_state(p.node).running  # again, under the locks
            if running:
                stopping(rt.connector, [p.node.name])  # its own stops do not count against its lock
                rt.provider.stop(p.node)
            remove_exporter(rt, p.node)
            if args.purge:
                rt.provider.purge(p.node)
            say(_destroy_words(p.node.name, running, args.purge, p.exporter))
        if args.purge:
            _drop_state(rt.state_dir, say)  # under the lock, the lock file last
    _drop_textfiles(args, name, say)
    return True


def _state_files(state_dir: Path) -> list[Path]:
    """What a purged topology's state dir may still hold beside its nodes' folders, each naming the purged nodes
    (ids, addresses) and read by a fresh deploy as its own: the slot, restore and migration journals, the failover
    reports (the cool-down reads them), and the lock file. The TLS material (tls/) stays: clients trust its CA."""
    from opsctl.failover.report import REPORT_DIR
    from opsctl.migrate.phases import JOURNAL as MIGRATE_JOURNAL
    from opsctl.restore.route import JOURNAL as RESTORE_JOURNAL
    from opsctl.slots.journal import JOURNAL as SLOTS_JOURNAL
    from opsctl.state.statelock import LOCK_NAME

    names = (SLOTS_JOURNAL, RESTORE_JOURNAL, MIGRATE_JOURNAL, REPORT_DIR, LOCK_NAME)
    return [path for path in (state_dir / name for name in names) if path.is_symlink() or path.exists()]


def _purge_state(state_dir: Path, dry_run: bool, say: Lines) -> None:
    """destroy --purge with no node left to purge: the state files a killed purge left go (under the lock: a run
    that starts meanwhile reads none half-removed); a dry run names them."""
    from opsctl.state.statelock import state_lock

    found = _state_files(state_dir)
    if dry_run or not found:
        for path in found:
            say(f"would remove {path}")
        return
    with state_lock(state_dir):
        _drop_state(state_dir, say)


def _drop_state(state_dir: Path, say: Lines) -> None:
    """Remove _state_files (a link goes itself, never what it points to), the lock file last: this run holds it."""
    import shutil

    from opsctl.state.statelock import LOCK_NAME, remove_lock_file

    for path in _state_files(state_dir):
        if path.name == LOCK_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        say(f"removed {path}")
    remove_lock_file(state_dir)


def _drop_textfiles(args: argparse.Namespace, name: str, say: Lines) -> None:
    """--purge --metrics-textfile DIR: the topology's own signals go too (named in a dry run), nodes or not: they lie
    outside the state dir, where node_exporter reads them."""
    if args.metrics_textfile is None:
        return
    from opsctl.metrics.signals import remove_textfiles, topology_textfiles

    if args.dry_run:
        for path in topology_textfiles(args.metrics_textfile, name):
            say(f"would remove {path}")
        return
    for path in remove_textfiles(args.metrics_textfile, name):
        say(f"removed {path}")


def _check_textfile_folder(args: argparse.Namespace) -> None:
    """destroy's --metrics-textfile deletes the topology's signals, which only a purge does; both checked before
    anything is read or changed."""
    if args.metrics_textfile is None:
        return
    if not args.purge:
        raise OpsctlError("destroy --metrics-textfile deletes the topology's textfiles, which only --purge does",
                          hint="add --purge (it deletes the nodes' data too), or leave --metrics-textfile out")
    from opsctl.cli.runsignals import check_folder

    check_folder(args.metrics_textfile)


def _destroy_order(rt: Runtime) -> list[Node]:
    """Every node the state knows: first the ones the spec no longer keeps (retiring, parked, tombstones: their
    records, at the place they were deployed), then the sentinels, the replicas, the masters. Over SSH a tombstone
    on a host the spec lost is out of reach (no host entry names its SSH settings): the copy of it the hosts table
    carries goes with the spec's folder on the last purge of each host."""
    from opsctl.spec.deployed import deployed_from_records
    from opsctl.spec.placement import recorded_nodes

    spec, layout = rt.loaded.spec, rt.loaded.layout
    recorded = recorded_nodes(spec, layout, deployed_from_records(rt.provider.deployed_records()))
    if spec.provider == "ansible":
        recorded = tuple(n for n in recorded if n.host in {h.name for h in spec.hosts})
    return [*layout.retired, *recorded, *layout.sentinels, *[n for n in layout.servers if n.role == "replica"],
            *[n for n in layout.servers if n.role == "master"]]


class _Presence(NamedTuple):
    """A node as destroy finds it: its server runs, its exporter runs, it has files (a config or a record).
    A NamedTuple: this module is imported to build every parser, and dataclasses costs `opsctl --help` its import."""

    node: Node
    running: bool
    exporter: bool
    files: bool


def _presence(rt: Runtime, nodes: list[Node]) -> list[_Presence]:
    """Each node, whether its server runs, whether an exporter runs beside it, and whether it has files where the
    provider keeps them (its config is the first file a deployment writes; a tombstone holds its record alone), all
    nodes at once."""
    from pathlib import PurePath

    from opsctl.metrics.exporter_steps import exporter_runs
    from opsctl.net.fanout import fan_out

    def look(node: Node) -> _Presence:
        conf = PurePath(rt.provider.paths(node).conf).name
        files = rt.provider.read_file(node, conf) is not None or bool(rt.provider.load_record(node))
        return _Presence(node, rt.provider.process_state(node).running, exporter_runs(rt, node), files)

    return fan_out(look, nodes)


def _destroy_words(name: str, stopped: bool, purged: bool, exporter: bool = False, dry_run: bool = False) -> str:
    """What destroy did (or, in a dry run, would do) to a node, and only that: 'stopped N', 'stopped N and purged its
    data', 'purged the data of N' (a node that was down), 'stopped the redis_exporter of N' (beside a node that was
    down), or that it was down already (it stopped since destroy looked)."""
    if dry_run:
        if not stopped:
            return f"would purge the data of {name}" if purged else f"would stop the redis_exporter of {name}"
        return f"would stop {name}{' and purge its data' if purged else ''}"
    if not stopped:
        if purged:
            return f"purged the data of {name}"
        return f"stopped the redis_exporter of {name}" if exporter else f"{name} was down already"
    return f"stopped {name}{' and purged its data' if purged else ''}"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="show what apply would change (exit 0 none, 2 changes, 1 error)")
    add_spec_options(p, output=True)
    p.add_argument("--out", help="save the plan as JSON for apply --plan")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("apply", help="make the running topology match the spec")
    add_spec_options(p, output=True)
    p.add_argument("--plan", help="apply this saved plan; refused if the spec or live state moved since")
    rollout_options(p, "allow restarting a master in place (one without a replica to fail over to)")
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("apply", cmd_apply))

    p = sub.add_parser("status", help="each node's role, link, lag, memory, slots and the topology's health")
    add_spec_options(p, output=True)
    p.add_argument("--watch", nargs="?", const=2.0, default=None, type=WATCH_SECONDS, metavar="SECONDS",
                   help="refresh every SECONDS (default 2, 0.5..3600) with ops/s, until Ctrl-C; redrawn in place on "
                        "a terminal, one JSON line per refresh with --output json")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("destroy", help="stop every node (keeps data unless --purge)")
    add_spec_options(p, output=True)
    add_auto_approve(p)
    add_force_lock(p)
    add_dry_run(p, "print what would be stopped and purged; change nothing")
    p.add_argument("--purge", action="store_true", help="also delete data, configs and logs")
    p.add_argument("--metrics-textfile", metavar="DIR",
                   help="with --purge: also delete this topology's opsctl_<topology>_<command>.prom files in DIR "
                        "(node_exporter's textfile folder), so no alert reads a purged topology's old runs")
    p.set_defaults(handler=cmd_destroy)
