"""-f DIR: a folder's topologies through the fleet library (opsctl.fleet): validate, plan, apply (with --waves a
staged rollout), status, destroy; one summary printed, exit codes as for one topology (plan: 2 changes, 1 a failure;
apply: 0 only when all converged; status: 0 only when all are healthy)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from opsctl.base.errors import EXIT_CHANGES, EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, OpsctlError
from opsctl.cli.options import SECONDS, ranged

if TYPE_CHECKING:
    from opsctl.apply.planning import PlanResult
    from opsctl.fleet.summary import FleetResult, Shown
    from opsctl.spec.fleet import Fleet

PARALLEL = ranged(int, 1, 64)
S = TypeVar("S", bound="Shown")  # a single command's result (not imported at start: `opsctl --help` stays light)


def is_folder(args: argparse.Namespace) -> bool:
    """-f names a folder: the command runs on the fleet in it."""
    return getattr(args, "file", None) not in (None, "-") and Path(args.file).is_dir()


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """--only and --parallel, for -f DIR."""
    parser.add_argument("--only", metavar="NAME[,NAME]", help="with -f DIR: these topologies, in this order")
    parser.add_argument("--parallel", type=PARALLEL, default=4, metavar="N",
                        help="with -f DIR: at most N topologies at once (default 4, 1..64)")


def add_wave_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--waves", metavar="SIZES",
                        help="with -f DIR: a staged rollout, e.g. 1,25%%,100%% (cumulative), a health gate after "
                             "each wave; halts at the first failure")
    parser.add_argument("--gate-seconds", type=SECONDS, default=30.0, metavar="S",
                        help="how long each wave must stay healthy with no failover (default 30)")
    parser.add_argument("--resume", action="store_true",
                        help="go on with a rollout a failed gate halted (its wave is applied and gated again)")


def fleet_of(args: argparse.Namespace) -> Fleet:
    from opsctl.spec.fleet import refuse
    from opsctl.state.fleetfile import read_fleet

    if getattr(args, "state_dir", None) is not None:
        raise OpsctlError("-f DIR keeps each topology's state beside its spec: --state-dir is for one spec",
                          hint="leave --state-dir out")
    only = [n.strip() for n in args.only.split(",") if n.strip()] if getattr(args, "only", None) else None
    fleet = read_fleet(args.file, only)  # merged with its bases, each spec validated
    refuse(fleet)  # the fleet-level checks: two topologies on one host:port, a name used twice, ...
    return fleet


def cmd_validate(args: argparse.Namespace) -> int:
    from opsctl.cli.output import print_result
    from opsctl.cli.results import ValidateResult
    from opsctl.fleet.summary import FleetResult, Outcome

    fleet = fleet_of(args)
    print_result(FleetResult("validate", tuple(Outcome(s.spec.name, ValidateResult(s, secrets=not args.no_secrets))
                                               for s in fleet.specs)), args.output)
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from opsctl.apply import plan
    from opsctl.base.events import tagged
    from opsctl.cli.output import print_result, printing
    from opsctl.fleet.summary import FleetResult, run_each
    from opsctl.runtime.opening import open_runtime
    from opsctl.spec.load import LoadedSpec

    if args.out:
        raise OpsctlError("plan --out saves one topology's plan: not with -f DIR", hint="leave --out out")

    refuse_origins_as_text(args)

    def one(loaded: LoadedSpec) -> PlanResult:
        with open_runtime(loaded) as rt:
            return with_origins(plan(rt, emit=tagged(printer, loaded.spec.name)), args, loaded.file)

    with printing(args.output == "json") as printer:
        result = FleetResult("plan", tuple(run_each(one, fleet_of(args).specs, args.parallel)))
    print_result(result, args.output)
    if result.failed:
        return EXIT_ERROR
    return EXIT_CHANGES if any(o.result is not None and o.result.changes for o in result.outcomes) else EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from opsctl.cli.output import print_result
    from opsctl.fleet.summary import FleetResult, run_each
    from opsctl.runtime.opening import open_runtime
    from opsctl.spec.load import LoadedSpec
    from opsctl.status import StatusResult, status

    if args.watch is not None:
        raise OpsctlError("status --watch follows one topology: not with -f DIR", hint="use -f SPEC")

    def one(loaded: LoadedSpec) -> StatusResult:
        with open_runtime(loaded) as rt:
            return status(rt)

    result = FleetResult("status", tuple(run_each(one, fleet_of(args).specs, args.parallel)))
    print_result(result, args.output)
    healthy = all(o.result is not None and o.result.healthy for o in result.outcomes)
    return EXIT_OK if healthy else EXIT_ERROR


def cmd_apply(args: argparse.Namespace) -> int:
    from opsctl.apply import ApplyOptions
    from opsctl.cli.options import confirm
    from opsctl.cli.output import print_result
    from opsctl.fleet.rollout import RolloutOptions, apply_all, parse_waves, rollout

    if args.plan or args.dry_run:
        raise OpsctlError("apply -f DIR applies each topology's spec: --plan and --dry-run are for one spec",
                          hint="`opsctl plan -f DIR` shows what each topology would change")
    sizes = parse_waves(args.waves) if args.waves else None  # checked before anything is read
    fleet = fleet_of(args)
    confirm(args, f"Apply {len(fleet.specs)} topologies of {fleet.folder}?")
    options = ApplyOptions(allow_downtime=args.allow_downtime, parallel_shards=args.parallel_shards,
                           wait_timeout=args.wait_timeout)
    if sizes is None:
        result = apply_all(fleet, options, args.parallel)
        print_result(result, args.output)
        return EXIT_ERROR if result.failed else EXIT_OK
    done = rollout(fleet, RolloutOptions(sizes, args.gate_seconds, args.parallel, options, args.resume))
    print_result(done, args.output)
    return EXIT_ERROR if done.halted else EXIT_OK


def cmd_destroy(args: argparse.Namespace) -> int:
    from opsctl.cli.options import confirm
    from opsctl.cli.output import print_result
    from opsctl.destroy import DestroyOptions, DestroyResult, destroy
    from opsctl.fleet.summary import FleetResult, run_each
    from opsctl.runtime.opening import open_runtime
    from opsctl.spec.load import LoadedSpec

    if not args.only and not args.all:
        raise OpsctlError("destroy -f DIR needs --only NAME[,NAME] or --all", hint="name what to destroy")
    if args.metrics_textfile is not None:
        raise OpsctlError("destroy -f DIR does not take --metrics-textfile", hint="destroy each topology by -f SPEC")
    fleet = fleet_of(args)
    what = "stop every node and DELETE its data" if args.purge else "stop every node (data is kept)"
    names = ", ".join(s.spec.name for s in fleet.specs)
    confirm(args, f"This will {what} of {names}.")

    def one(loaded: LoadedSpec) -> DestroyResult:
        with open_runtime(loaded) as rt:
            return destroy(rt, DestroyOptions(args.purge, args.dry_run))

    result = FleetResult("destroy", tuple(run_each(one, fleet.specs, args.parallel)))
    print_result(result, args.output)
    return EXIT_ERROR if result.failed else EXIT_OK


def refuse_with_folder(args: argparse.Namespace, dests: tuple[str, ...], command: str) -> None:
    """Options of one topology given with -f DIR: refused by name, before anything is read."""
    from opsctl.cli.options import refuse_given

    refuse_given(args, dests, f"one topology (-f SPEC), not with {command} -f DIR",
                 f"drop the option, or run `opsctl {command} -f SPEC` for that topology")


def worst_exit(result: FleetResult[S], code: Callable[[S], int]) -> int:
    """The worst exit code a single command gives among the topologies: a failure (1), else findings (4), else 0."""
    codes = [EXIT_ERROR if o.result is None else code(o.result) for o in result.outcomes]
    order = (EXIT_ERROR, EXIT_FINDINGS, EXIT_OK)
    return min(codes, key=order.index, default=EXIT_OK)


def refuse_origins_as_text(args: argparse.Namespace) -> None:
    """plan --show-origins adds the merged spec to plan's JSON; as text, render shows it."""
    if args.show_origins and args.output != "json":
        raise OpsctlError("plan --show-origins adds the merged spec to the JSON plan: it goes with --output json",
                          hint="add --output json, or print it as text: opsctl render -f "
                               f"{'SPEC' if is_folder(args) else args.file} --dir - --show-origins")


def with_origins(result: PlanResult, args: argparse.Namespace, spec_file: str | None = None) -> PlanResult:
    """result with the merged spec of spec_file (by default -f's) when --show-origins asks for it."""
    from dataclasses import replace

    from opsctl.state.specfile import spec_origin_entries

    if not args.show_origins:
        return result
    return replace(result, origins=tuple(spec_origin_entries(spec_file or args.file)))
