"""`opsctl cluster check|reshard|rebalance|fix -f SPEC`: inspect a cluster and move its slots."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError, echo
from opsctl.cli.commands.fleetrun import add_fleet_options
from opsctl.cli.options import (
    RATE,
    SECONDS,
    SLOTS,
    add_auto_approve,
    add_dry_run,
    add_force_lock,
    add_metrics_textfile,
    add_output,
    add_spec_file,
    add_spec_options,
    add_state_dir,
    confirm,
    ranged,
)
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:  # annotations only: `opsctl cluster --help` imports no client or slot module
    from pathlib import Path

    from opsctl.base.events import Emit
    from opsctl.cli.results import ClusterCheckResult
    from opsctl.net.connector import Connector
    from opsctl.slots.reshard import MoveOptions
    from opsctl.slots.session import SlotsOutcome
    from opsctl.spec.load import LoadedSpec

SlotOperation = Callable[["Connector", "Path", "Emit", "MoveOptions"], "SlotsOutcome"]


def _cluster_spec(path: str) -> LoadedSpec:
    from opsctl.state.specfile import read_spec

    loaded = read_spec(path)
    if loaded.spec.topology != "cluster":
        raise OpsctlError(f"{loaded.file} describes a {loaded.spec.topology} topology, not a cluster",
                          hint="use `opsctl status -f SPEC` for other topologies")
    return loaded


def cmd_check(args: argparse.Namespace) -> int:
    from opsctl.cli.commands.fleetrun import is_folder
    from opsctl.cli.output import print_result

    if is_folder(args):
        return _check_fleet(args)
    result = check_one(_cluster_spec(args.file), getattr(args, "state_dir", None), args.timeout)
    print_result(result, args.output)
    return EXIT_OK if result.report.healthy else EXIT_ERROR


def _check_fleet(args: argparse.Namespace) -> int:
    """cluster check -f DIR: each cluster of the folder (the other topologies are not clusters: left out)."""
    from opsctl.cli.commands.fleetrun import fleet_of
    from opsctl.cli.output import print_result
    from opsctl.fleet.summary import FleetResult, run_each

    fleet = fleet_of(args)
    clusters = [s for s in fleet.specs if s.spec.topology == "cluster"]
    if not clusters:
        raise OpsctlError(f"{fleet.folder}: no cluster topology among {', '.join(s.spec.name for s in fleet.specs)}",
                          hint="use `opsctl status -f DIR` for other topologies")
    result = FleetResult("cluster check", tuple(run_each(lambda loaded: check_one(loaded, None, args.timeout),
                                                         clusters, args.parallel)))
    print_result(result, args.output)
    healthy = all(o.result is not None and o.result.report.healthy for o in result.outcomes)
    return EXIT_OK if healthy else EXIT_ERROR


def check_one(loaded: LoadedSpec, state_dir_arg: str | None, timeout: float) -> ClusterCheckResult:
    """One cluster's check: the servers deployed, where they run (by their records: drained ones too, until the
    apply that removes them), not where a fresh deploy puts them; the ones the next apply adds are to be added,
    not unreachable."""
    from dataclasses import replace

    from opsctl.cli.results import ClusterCheckResult
    from opsctl.cluster.check import summarize
    from opsctl.net.observer import observe
    from opsctl.runtime.opening import open_connector, recorded_placement
    from opsctl.spec.deployed import pending_nodes, running_nodes
    from opsctl.state.localdirs import state_dir_for

    state_dir = state_dir_for(loaded, state_dir_arg)
    placed, records = recorded_placement(loaded, state_dir)
    servers = [n for n in running_nodes(placed.layout, records) if not n.is_sentinel]
    with open_connector(loaded, state_dir) as connector:
        report = summarize(observe(connector, servers, timeout=timeout))
    return ClusterCheckResult(replace(report, pending=tuple(n.name for n in pending_nodes(placed.layout, records))))


def _slot_op(args: argparse.Namespace, operation: SlotOperation, resume: bool = True) -> int:
    """Common shell of reshard/rebalance/fix: spec, state dir, lock, refuse nodes that are not one cluster, resume
    what a killed run left, print."""
    from opsctl.cli.output import Printer, print_result
    from opsctl.cli.results import SlotsResult
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.slots.fix import close_open
    from opsctl.slots.reshard import MoveOptions, one_cluster
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.statelock import state_lock

    loaded = _cluster_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    emit = Printer(args.output == "json")
    options = MoveOptions(max_keys_per_sec=args.max_keys_per_sec, key_by_key=args.key_by_key)
    dry_run = getattr(args, "dry_run", False)
    with nullcontext() if dry_run else state_lock(state_dir), open_connector(loaded, state_dir) as connector, \
            nullcontext() if dry_run else topology_lock(connector, force=args.force_lock, emit=emit):  # dry: no lock
        seen = one_cluster(connector)
        if resume and not dry_run:
            close_open(connector, state_dir, emit, seen)
        outcome = operation(connector, state_dir, emit, options)
    note_run(args, keys=outcome.summary.keys if outcome.summary else 0)
    print_result(SlotsResult(outcome), args.output)
    return EXIT_OK


def cmd_reshard(args: argparse.Namespace) -> int:
    from opsctl.slots.reshard import reshard

    confirm(args, f"Move {args.slots} slot(s) and their keys from {args.source} to {args.target}?")
    return _slot_op(args, lambda connector, state_dir, emit, options: reshard(
        connector, state_dir, args.source, args.target, args.slots, emit, options, args.dry_run))


WEIGHT = ranged(float, 0.0, 1e6)
WINDOW = ranged(float, 0.5, 3600.0)
WINDOW_DEFAULT = 10.0
MEASURES = ("slots", "cpu", "network", "memory", "keys")
THRESHOLD = 2.0


def weight(pair: str) -> tuple[str, float]:
    """argparse type of --weight NODE=W: a node name and a finite weight from 0 (drain it) to 1e6."""
    name, sep, value = pair.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{echo(pair)} is not NODE=W (e.g. --weight orders-1=2)")
    return name, WEIGHT(value)


LOAD_THRESHOLD = 10.0  # --by a load: masters within 10% of the mean are left alone


def cmd_rebalance(args: argparse.Namespace) -> int:
    from opsctl.slots.reshard import rebalance

    if args.placement:
        return _rebalance_placement(args)
    if args.by != "slots":
        return _rebalance_by_load(args)
    if args.window is not None:
        raise OpsctlError("--window measures a load: it goes with --by cpu|network|memory|keys, not --by slots",
                          hint="drop --window, or name what to balance by with --by")
    weights = dict(args.weight)
    args.threshold = THRESHOLD if args.threshold is None else args.threshold
    confirm(args, "Move slots and their keys between masters to reach the balance?")
    return _slot_op(args, lambda connector, state_dir, emit, options: rebalance(
        connector, state_dir, weights, args.threshold, emit, options, args.dry_run))


def _rebalance_by_load(args: argparse.Namespace) -> int:
    """`cluster rebalance --by cpu|network|memory|keys`: measure each slot's cost, move the fewest keys that bring
    every master within --threshold of the mean (slots.byload)."""
    from opsctl.slots.byload import rebalance_by_load

    if args.weight:
        raise OpsctlError(f"--weight weighs slot counts: --by {args.by} balances the measured load evenly",
                          hint="drop --weight, or rebalance by --by slots")
    if args.window is not None and args.by in ("keys", "memory"):
        raise OpsctlError(f"--window measures counters over time: --by {args.by} reads the keys once",
                          hint="drop --window (it goes with --by cpu|network)")
    window = WINDOW_DEFAULT if args.window is None else args.window
    threshold = LOAD_THRESHOLD if args.threshold is None else args.threshold
    confirm(args, f"Measure {args.by} per slot and move slots and their keys between masters to even it out?")
    return _slot_op(args, lambda connector, state_dir, emit, options: rebalance_by_load(
        connector, state_dir, args.by, window, threshold, emit, options, args.dry_run))


def _rebalance_placement(args: argparse.Namespace) -> int:
    """`cluster rebalance --placement`: apply with cluster.rebalance_placement on for this run (members move to
    even out the hosts' load; --dry-run shows the moves). It moves members, not slots: --weight and --threshold
    are refused with it."""
    from opsctl.cli.commands.lifecycle import cmd_apply

    if args.weight or args.threshold is not None or args.by != "slots" or args.window is not None:
        raise OpsctlError("--weight, --threshold, --by and --window weigh slots: --placement moves members between "
                          "hosts instead",
                          hint="run `cluster rebalance --placement` without them, or the slot rebalance without "
                               "--placement")
    _cluster_spec(args.file)
    args.rebalance_placement = True
    for name, default in (("plan", None), ("allow_downtime", False), ("parallel_shards", 1)):
        setattr(args, name, default)
    return cmd_apply(args)


def cmd_fix(args: argparse.Namespace) -> int:
    from opsctl.slots.fix import fix

    if args.dry_run:
        return _fix_dry_run(args)
    if args.reassign_unreachable:
        confirm(args, "Give the slots of unreachable masters to others? The keys those masters hold are LOST.")
    return _slot_op(args, lambda connector, state_dir, emit, options: fix(
        connector, state_dir, emit, args.reassign_unreachable), resume=False)


def _fix_dry_run(args: argparse.Namespace) -> int:
    """What fix would act on: the check's open slots (closed as journaled) and uncovered slots; nothing changes."""
    from opsctl.cli.output import say

    say("dry run: fix closes the open slots and covers the uncovered slots the check below names",
        args.output == "json")
    args.timeout = 2.0
    cmd_check(args)
    return EXIT_OK


def _slot_args(p: argparse.ArgumentParser, dry_run: str = "show the moves, change nothing") -> None:
    add_spec_options(p, "where local state and the slot journal live")
    add_output(p, about="json: JSON events on stderr")
    p.add_argument("--max-keys-per-sec", type=RATE, default=None, help="throttle key-by-key moves")
    p.add_argument("--key-by-key", action="store_true", help="do not use the server's atomic slot migration")
    add_dry_run(p, dry_run)
    add_auto_approve(p, "do not ask before moving slots (keys move; a fault mid-way needs `cluster fix`)")
    add_force_lock(p)
    add_metrics_textfile(p)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("cluster", help="inspect a cluster's live state and move its slots")
    commands = group.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    p = commands.add_parser("check", help="slot coverage, open slots, agreement (exit 1 on problems)")
    add_spec_file(p)
    add_output(p)
    p.add_argument("--timeout", type=ranged(float, 0.1, 600.0), default=2.0, help="seconds to wait for each node")
    add_state_dir(p, "where local state lives (generated TLS certificates too)")
    add_fleet_options(p)
    p.set_defaults(handler=cmd_check)

    p = commands.add_parser("reshard", help="move N slots from one master to another")
    _slot_args(p)
    p.add_argument("--from", dest="source", required=True, help="source master: node name or address:port")
    p.add_argument("--to", dest="target", required=True, help="target master: node name or address:port")
    p.add_argument("--slots", type=SLOTS, required=True, help="how many slots to move (1..16384)")
    p.set_defaults(handler=recorded("cluster reshard", cmd_reshard))

    p = commands.add_parser("rebalance", help="move the fewest slots that reach a weighted balance")
    _slot_args(p)
    p.add_argument("--weight", type=weight, action="append", default=[], metavar="NODE=W",
                   help="relative share (default 1)")
    p.add_argument("--threshold", type=ranged(float, 0.0, 100.0), default=None, metavar="PCT",
                   help="leave masters within PCT%% of their share alone (default 2; with --by a load: within "
                        "PCT%% of the mean load, default 10)")
    p.add_argument("--by", choices=MEASURES, default="slots",
                   help="what to even out: slot counts (default), or each slot's measured cpu, network, memory or "
                        "keys (docs/slots.md: balancing by load)")
    p.add_argument("--window", type=WINDOW, default=None, metavar="SECONDS",
                   help=f"--by cpu|network: how long to measure the per-slot counters (default {WINDOW_DEFAULT:g})")
    p.add_argument("--placement", action="store_true",
                   help="move members between hosts instead of slots, until members per host differ by at most "
                        "one (each a new replica, synced, a master failed over first, the old one retired)")
    p.add_argument("--wait-timeout", type=SECONDS, default=60.0, metavar="S",
                   help="--placement: how long a failover's checks or a new replica's sync may take")
    p.set_defaults(handler=recorded("cluster rebalance", cmd_rebalance))

    p = commands.add_parser("fix", help="close open slots (journaled ones exactly), cover uncovered slots")
    _slot_args(p, "show the cluster's open and uncovered slots (what fix acts on); change nothing")
    p.add_argument("--reassign-unreachable", action="store_true",
                   help="give the slots of an unreachable master to others (its data is LOST)")
    p.set_defaults(handler=recorded("cluster fix", cmd_fix))
