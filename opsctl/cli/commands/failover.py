"""`opsctl failover -f SPEC (--shard N | --master NODE | --to REPLICA)`: the manual failover runbook."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_OK
from opsctl.cli.options import (
    add_auto_approve,
    add_dry_run,
    add_force_lock,
    add_metrics_textfile,
    add_output,
    add_spec_options,
    confirm,
    ranged,
)
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:  # annotations only: `opsctl --help` imports no runtime module
    from opsctl.net.connector import Connector
    from opsctl.providers.base import Provider
    from opsctl.spec.load import LoadedSpec


# at most what the next run's cool-down check accepts in a report a killed run left (failover.report.MAX_TIMEOUT_S,
# not imported here: the parser is built without the failover package; tests/test_cli_args.py pins them equal)
MAX_PHASE_SECONDS = 3600.0


def cmd_failover(args: argparse.Namespace) -> int:
    from opsctl.cli.output import Printer, print_result, printing
    from opsctl.cli.results import FailoverResult
    from opsctl.failover.runbook import Options, run_failover
    from opsctl.net.topolock import topology_lock
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.safefs import check_writable_target
    from opsctl.state.specfile import read_spec
    from opsctl.state.statelock import state_lock

    if args.report:
        check_writable_target(args.report, "--report")  # before the failover, not after it succeeded
    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    confirm(args, "Fail over now? Clients reconnect to the new master.",
            "pass --auto-approve (or --yes) in scripts (run with --dry-run first to see the checks)")
    opts = Options(shard=args.shard, master=args.master, to=args.to, mode=args.mode, escalate=args.escalate,
                   dry_run=args.dry_run, force_checks=args.force_checks, yes=args.auto_approve,
                   max_lag_bytes=args.max_lag_bytes, max_lag_seconds=args.max_lag_seconds, timeout=args.timeout,
                   report=args.report, failover_command=not args.no_failover_command)
    json_mode = args.output == "json"

    # a run's notes go where a person reads them: stdout in text, stderr beside the JSON result; a dry run takes no
    # lock, so it writes nothing (not even the state dir)
    promoting = opts.mode == "force" and not args.dry_run
    with printing(json_mode, sys.stderr if json_mode else sys.stdout) as emit, \
            nullcontext() if args.dry_run else state_lock(state_dir), \
            _reaching(loaded, state_dir, promoting) as (connector, provider), \
            nullcontext() if args.dry_run else topology_lock(connector, force=args.force_lock,
                                                                   emit=Printer(json_mode)):
        report = run_failover(connector, state_dir, opts, emit, provider)
    print_result(FailoverResult(report), args.output)
    return EXIT_OK


@contextmanager
def _reaching(loaded: LoadedSpec, state_dir: Path, promoting: bool) -> Iterator[tuple[Connector, Provider | None]]:
    """The connector, and with it the provider where a replication topology's forced promotion stops the old
    master's process (the runtime's: its hosts are reached as apply reaches them)."""
    from opsctl.runtime.opening import make_runtime, open_connector

    if not promoting or loaded.spec.topology != "replication":
        with open_connector(loaded, state_dir) as connector:
            yield connector, None
        return
    runtime = make_runtime(loaded, str(state_dir))
    try:
        yield runtime.connector, runtime.provider
    finally:
        runtime.provider.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("failover", help="promote a replica, with pre-checks, polling, post-checks and a report")
    add_spec_options(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--shard", type=ranged(int, 1, 16384), help="fail over this shard (1..N) to its best replica")
    which.add_argument("--master", help="fail over the shard whose master is this node (name or address:port)")
    which.add_argument("--to", help="promote this replica (name or address:port)")
    p.add_argument("--mode", choices=("graceful", "force", "takeover"), default="graceful",
                   help="cluster: graceful, force or takeover; replication: force promotes a replica with the "
                        "master gone; force and takeover can lose acknowledged writes and need --yes")
    p.add_argument("--escalate", action="store_true",
                   help="cluster: if a mode times out, try the next (graceful -> force -> takeover); needs --yes")
    add_dry_run(p, "print the pre-checks and the steps; change nothing")
    p.add_argument("--force-checks", action="store_true", help="go on although a pre-check failed")
    add_auto_approve(p, "do not ask; consent to the risks of force/takeover")
    add_force_lock(p)
    p.add_argument("--report", help="also write the JSON report here")
    p.add_argument("--max-lag-bytes", type=ranged(int, 0, 2**50), default=1024 * 1024,
                   help="pre-check limit (default 1 MiB)")
    p.add_argument("--max-lag-seconds", type=ranged(int, 0, 86400), default=3,
                   help="pre-check limit on the last ack's age")
    p.add_argument("--timeout", type=ranged(float, 0.1, MAX_PHASE_SECONDS), default=10.0,
                   help=f"seconds each phase may take (0.1 to {MAX_PHASE_SECONDS:g})")
    p.add_argument("--no-failover-command", action="store_true",
                   help="replication: pause + REPLICAOF NO ONE even where the server has FAILOVER")
    add_output(p)
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("failover", cmd_failover))
