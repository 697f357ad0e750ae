"""plan, apply, status, destroy: the main job. Each parses its options, calls its library operation (opsctl.apply,
opsctl.status, opsctl.destroy) on a runtime opened from -f/--state-dir, and prints what it returns."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.commands import fleetrun
from opsctl.cli.commands.fleetrun import add_fleet_options, add_wave_options, is_folder
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

if TYPE_CHECKING:  # annotations only: `opsctl --help` imports no runtime, plan or facts module
    from opsctl.apply.rounds import Approve
    from opsctl.base.events import Emit, Event
    from opsctl.cli.output import Printer
    from opsctl.plan.steps import Plan
    from opsctl.runtime.opening import Runtime
    from opsctl.status.looks import StatusResult


@contextmanager
def opened(args: argparse.Namespace, locked: bool = False, keep_spec: bool = False) -> Iterator[Runtime]:
    """The runtime of -f/--state-dir (runtime.opening.open_runtime), under the locks if asked (--force-lock).
    keep_spec: keep the validated spec beside it even on a first run (plan and apply, a pipeline's pair)."""
    from pathlib import Path

    from opsctl.cli.output import Printer
    from opsctl.cli.runsignals import note_run
    from opsctl.runtime.opening import RuntimeOptions, open_runtime
    from opsctl.state.specfile import read_spec_to_keep

    loaded, keep = read_spec_to_keep(args.file)
    if getattr(args, "rebalance_placement", False):  # `cluster rebalance --placement`: for this run only
        from opsctl.plan.spread import with_rebalancing

        loaded = with_rebalancing(loaded)
    note_run(args, loaded.spec.name)  # --metrics-textfile names it, however the run ends
    state_dir = getattr(args, "state_dir", None)
    options = RuntimeOptions(None if state_dir is None else Path(state_dir), locked,
                             getattr(args, "force_lock", False), keep if keep_spec else None,
                             Printer(getattr(args, "output", None) == "json"))
    with open_runtime(loaded, options) as rt:
        yield rt


def approving(args: argparse.Namespace, question: Callable[[Plan], str]) -> Approve:
    """apply's and restart's approval: each plan printed as plan prints it; one with steps confirmed (asked on a
    terminal, refused without one unless --auto-approve; a dry run asks nothing)."""
    from opsctl.apply.planning import PlanResult
    from opsctl.cli.output import print_result

    def approve(plan: Plan) -> None:
        print_result(PlanResult(plan), args.output)
        if not plan.empty:
            confirm(args, question(plan))

    return approve


def rounds_printer(printer: Printer, done: str | None = None) -> Emit:
    """A run's events as the CLI prints them, through printer (a bar on a terminal, erased before a line). done: a
    round's end in other words ('Restarted') as text."""
    from opsctl.apply.rounds import RoundDone
    from opsctl.base.events import Note

    def emit(event: Event) -> None:
        if done and isinstance(event, RoundDone) and not printer.json_mode:
            event = Note(f"{done} in {event.seconds:.2f}s.")  # wall time: steps run side by side
        printer(event)

    return emit


def print_status(status: StatusResult, output: str) -> None:
    """The status; as text, how to get healthy on stderr when it is not."""
    from opsctl.cli.output import print_result, say

    print_result(status, output)
    if output == "text" and status.hint is not None:  # for people: as JSON, "healthy" and "health" say it
        say(f"  hint: {status.hint}", json_mode=False)


def cmd_plan(args: argparse.Namespace) -> int:
    if is_folder(args):
        return fleetrun.cmd_plan(args)
    from pathlib import Path

    from opsctl.apply import PlanOptions, plan
    from opsctl.cli.output import print_result, printing
    from opsctl.state.safefs import check_writable_target

    if args.out:
        check_writable_target(args.out, "--out")
    fleetrun.refuse_origins_as_text(args)
    with opened(args, keep_spec=True) as rt, printing(args.output == "json") as printer:
        _say_standby(rt, args.output == "json")
        result = fleetrun.with_origins(plan(rt, PlanOptions(Path(args.out) if args.out else None), printer), args)
    print_result(result, args.output)
    return EXIT_CHANGES if result.changes else EXIT_OK


def _say_standby(rt: Runtime, json_mode: bool, applying: bool = False) -> None:
    """A standby's plan and apply say so first; a switched-over one whose spec still follows is refused."""
    from opsctl.cli.output import say
    from opsctl.state.standbyfiles import check_declared

    line = check_declared(rt.loaded, rt.state_dir, applying)
    if line is not None:
        from opsctl.standby.primary import primary_of

        primary_of(rt.loaded)  # neither itself nor a standby of this one
        say(line, json_mode)
        if applying:  # before any step: a site made a standby (the way back) stops taking client writes first
            from opsctl.standby.link import fence_live

            fenced, missed = fence_live(rt.connector)
            if fenced:
                say(f"fenced against client writes: {', '.join(fenced)}"
                    + (f" (not answering, they start fenced: {', '.join(missed)})" if missed else ""), json_mode)


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


WATCH_SECONDS = ranged(float, 0.5, 3600.0)  # status --watch: faster than 0.5 s is a load, not a view


def cmd_apply(args: argparse.Namespace) -> int:
    if is_folder(args):
        return fleetrun.cmd_apply(args)
    from opsctl.apply import ApplyOptions, apply
    from opsctl.apply.planfile import SavedPlan
    from opsctl.cli.output import printing

    saved = SavedPlan.read(args.plan) if args.plan else None  # a bad file is refused before anything is done
    options = ApplyOptions(saved, args.dry_run, args.allow_downtime, args.parallel_shards, args.wait_timeout,
                           approve=approving(args, lambda p: f"Apply {len(p.steps)} step(s) to '{p.spec_name}'?"))
    # a dry run takes no lock and writes nothing
    with opened(args, locked=not args.dry_run, keep_spec=not args.dry_run) as rt:
        _say_standby(rt, args.output == "json", applying=not args.dry_run)
        with printing(args.output == "json") as printer:
            result = apply(rt, options, rounds_printer(printer))
        if result.review is not None:
            _needs_review(args, result.review)
        if result.status is not None:
            print_status(result.status, args.output)
    if result.status is None:
        return EXIT_CHANGES if result.changes else EXIT_OK
    if not result.healthy:
        raise OpsctlError("apply finished, but the topology is not healthy (see the status above)",
                          hint="apply again once the node named above answers; `opsctl status` shows every node")
    return EXIT_OK


def _needs_review(args: argparse.Namespace, rest: Plan) -> None:
    """A saved plan runs exactly its own steps: when it started down nodes first (plan.replan), the steps their
    answers call for were never reviewed. They are shown, not run, and exit 2 says a new plan is due."""
    from opsctl.apply.planning import plan_text
    from opsctl.base.events import Note
    from opsctl.cli.output import printing

    with printing(args.output == "json") as printer:
        printer(Note("The saved plan's steps are done. What the nodes it started now call for was not in it:"))
        printer(Note(plan_text(rest)))
        printer(Note(f"  hint: review them with opsctl plan -f {args.file} --out FILE, then apply that plan"))


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 only when the topology is healthy: a node down, a refused password or a cluster not ok is 1."""
    if is_folder(args):
        return fleetrun.cmd_status(args)
    from opsctl.status import status

    with opened(args) as rt:
        if args.watch is not None:
            from opsctl.cli.watch import watch_status

            return watch_status(rt, args.output, args.watch)
        result = status(rt)
        print_status(result, args.output)
    return EXIT_OK if result.healthy else EXIT_ERROR


def cmd_destroy(args: argparse.Namespace) -> int:
    if is_folder(args):
        return fleetrun.cmd_destroy(args)
    from pathlib import Path

    from opsctl.cli.output import Lines, print_result
    from opsctl.destroy import DestroyOptions, destroy

    _check_textfile_folder(args)
    say = Lines(args.output)
    with opened(args) as rt:
        what = "stop every node and DELETE its data" if args.purge else "stop every node (data is kept)"
        question = f"This will {what} of '{rt.loaded.spec.name}'."
        options = DestroyOptions(args.purge, args.dry_run,
                                 None if args.metrics_textfile is None else Path(args.metrics_textfile),
                                 lambda todo: confirm(args, question))
        result = destroy(rt, options, lambda event: say(event.line()))
    if say.json_mode:
        print_result(result, "json")
    return EXIT_OK


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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="show what apply would change (exit 0 none, 2 changes, 1 error)")
    add_spec_options(p, output=True)
    p.add_argument("--out", help="save the plan as JSON for apply --plan")
    p.add_argument("--show-origins", action="store_true",
                   help="with --output json: add the spec merged with its bases (extends:), each value with the "
                        "file:line it came from (spec_origins; secrets hidden)")
    add_fleet_options(p)
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("apply", help="make the running topology match the spec")
    add_spec_options(p, output=True)
    p.add_argument("--plan", help="apply this saved plan; refused if the spec or live state moved since")
    rollout_options(p, "allow restarting a master in place (one without a replica to fail over to)")
    add_metrics_textfile(p)
    add_fleet_options(p)
    add_wave_options(p)
    p.set_defaults(handler=recorded("apply", cmd_apply))

    p = sub.add_parser("status", help="each node's role, link, lag, memory, slots and the topology's health")
    add_spec_options(p, output=True)
    p.add_argument("--watch", nargs="?", const=2.0, default=None, type=WATCH_SECONDS, metavar="SECONDS",
                   help="refresh every SECONDS (default 2, 0.5..3600) with ops/s, until Ctrl-C; redrawn in place on "
                        "a terminal, one JSON line per refresh with --output json")
    add_fleet_options(p)
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
    add_fleet_options(p)
    p.add_argument("--all", action="store_true", help="with -f DIR: every topology of the folder")
    p.set_defaults(handler=cmd_destroy)
