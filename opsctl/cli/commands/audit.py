"""`opsctl audit` (the development standard checked on live nodes) and `opsctl bigkey delete`."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from opsctl.base.errors import EXIT_FINDINGS, EXIT_OK, OpsctlError
from opsctl.cli.commands.fleetrun import add_fleet_options, fleet_of, refuse_with_folder, worst_exit
from opsctl.cli.options import (
    RATE,
    STATE_DIR_TUNNELS_HELP,
    add_auto_approve,
    add_dry_run,
    add_output,
    add_spec_options,
    ranged,
)
from opsctl.cli.ttyline import TtyLine

if TYPE_CHECKING:
    from opsctl.audit.survey import AuditOptions, AuditReport
    from opsctl.base.events import Event
    from opsctl.observe.findings import Finding
    from opsctl.spec.load import LoadedSpec

CHECK_CHOICES = ("config", "bigkeys", "hotkeys", "keys", "ttl", "slowlog", "memory", "tls", "all")


def scan_line(done: int, total: int, nodes: int, elapsed: float) -> str:
    """`[#####.....] 52000/100000 keys, 3 nodes  26000 keys/s  ETA 2s`; total is DBSIZE, an estimate. Pure."""
    from opsctl.base.events import gauge, human_seconds, plural  # not at import: `opsctl --help` loads this module

    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and done < total else (0.0 if done >= total else None)
    return (f"{gauge(done, total, 20)} {done}/{total} keys, {plural(nodes, 'node')}  {rate:.0f} keys/s  "
            f"ETA {human_seconds(eta)}")


class ProgressBar:
    """Keys scanned on every node, rate and ETA, redrawn on one line of a terminal (at most 10 times a second);
    with heartbeat (off a terminal) a plain line at most that often instead, as the event printer's heartbeat."""

    def __init__(self, stream: TextIO | None = None, heartbeat: float | None = None) -> None:
        self.counts: dict[str, tuple[int, int]] = {}
        self.started = time.monotonic()
        self.stream = stream or sys.stderr
        self.line = TtyLine(self.stream)
        self.heartbeat = heartbeat
        self.beat = self.started  # when the last heartbeat line was printed: a scan shorter than one, none
        self.lock = threading.Lock()

    def _text(self) -> str:
        done = sum(d for d, _ in self.counts.values())
        total = sum(t for _, t in self.counts.values())
        return scan_line(done, total, len(self.counts), time.monotonic() - self.started)

    def __call__(self, node: str, done: int, total: int) -> None:
        with self.lock:
            self.counts[node] = (done, total)
            if self.heartbeat is None:
                self.line.show(self._text())
            elif time.monotonic() - self.beat >= self.heartbeat:
                self.beat = time.monotonic()
                print(self._text(), file=self.stream, flush=True)

    def emit(self, event: Event) -> None:
        """The audit's progress events, each node's latest count folded into the one line."""
        from opsctl.audit.scan import ScanProgress

        if isinstance(event, ScanProgress):
            self(event.node, event.done, event.total)

    def close(self) -> None:
        """The final counts on a line of their own (nothing when no node was scanned)."""
        with self.lock:
            if self.counts and self.heartbeat is None:
                self.line.done(self._text())
            elif self.counts and self.beat > self.started:  # a heartbeat was said: the final counts close it
                print(self._text(), file=self.stream, flush=True)


def _check_name(text: str) -> str:
    if text not in CHECK_CHOICES:
        raise argparse.ArgumentTypeError(f"unknown check {text!r} (choose from {', '.join(CHECK_CHOICES)})")
    return text


def _checks(names: list[str]) -> tuple[str, ...]:
    from opsctl.audit.survey import CHECKS

    if not names or "all" in names:
        return CHECKS
    return tuple(c for c in CHECKS if c in names)


def _audit(args: argparse.Namespace) -> int:
    from opsctl.cli.commands.fleetrun import is_folder

    if is_folder(args):
        return audit_fleet(args)
    if args.hot:
        return _audit_hot(args)
    if args.metrics_textfile is not None:
        raise OpsctlError("--metrics-textfile writes the hottest slots: it goes with --hot",
                          hint="add --hot, or drop --metrics-textfile")
    from opsctl.base.events import HEARTBEAT
    from opsctl.cli.output import print_result
    from opsctl.cli.results import AuditResult
    from opsctl.observe.findings import at_or_above
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    if args.nice > 0:
        os.nice(args.nice)  # a scan is background work: never take CPU from a server on the same host
    bar = ProgressBar(heartbeat=None if sys.stderr.isatty() else HEARTBEAT) if args.output == "table" else None
    try:
        report = audit_report(loaded, args.state_dir, audit_options(args), bar.emit if bar else None)
    finally:
        if bar:
            bar.close()
    print_result(AuditResult(report, html=args.output == "html"), args.output)
    refuse_unread(report.findings)
    return EXIT_FINDINGS if at_or_above(report.findings, args.fail_on) else EXIT_OK


def audit_options(args: argparse.Namespace) -> AuditOptions:
    """The checks and thresholds the command line asks for."""
    from opsctl.audit.keyspace import Thresholds
    from opsctl.audit.survey import AuditOptions

    thresholds = Thresholds(string_bytes=args.string_bytes, elements=args.elements, top=args.top,
                            max_key_length=args.max_key_length, expiry_cluster_keys=args.expiry_cluster,
                            no_ttl_share=args.no_ttl_share, no_ttl_min_keys=args.no_ttl_min_keys)
    return AuditOptions(_checks(args.checks), thresholds, args.allow_masters, args.max_ops_per_sec, args.count,
                        args.batch, args.window)


def audit_report(loaded: LoadedSpec, state_dir_arg: str | None, options: AuditOptions,
                 emit: Callable[[Event], None] | None) -> AuditReport:
    """One topology audited: the nodes that run (drained ones too; not the ones the next apply adds)."""
    from opsctl.audit.survey import run_audit
    from opsctl.runtime.opening import open_connector, recorded_placement
    from opsctl.spec.deployed import running_nodes
    from opsctl.state.localdirs import state_dir_for

    state_dir = state_dir_for(loaded, state_dir_arg)
    placed, records = recorded_placement(loaded, state_dir)
    with open_connector(loaded, state_dir) as connector:
        return run_audit(connector, options, emit, running_nodes(placed.layout, records))


def _audit_hot(args: argparse.Namespace) -> int:
    """`audit --hot`: each master's hottest slots over --hot-window seconds, and their hottest keys where the
    maxmemory-policy is LFU (docs/slots.md: balancing by load)."""
    from pathlib import Path

    from opsctl.audit.hot import hot_report
    from opsctl.cli.output import Printer, print_result
    from opsctl.cli.results import HotResult
    from opsctl.cli.runsignals import check_folder
    from opsctl.metrics.signals import write_hot_textfile
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    if loaded.spec.topology != "cluster":
        raise OpsctlError(f"--hot ranks a cluster's slots: {loaded.file} describes a {loaded.spec.topology} topology",
                          hint="the hotkeys check (`opsctl audit -f SPEC hotkeys`) ranks keys on any topology")
    if args.output == "html":
        raise OpsctlError("--hot prints text or json", hint="use --output table or --output json")
    if args.metrics_textfile is not None:
        check_folder(args.metrics_textfile)  # before measuring: a wrong folder changes nothing
    with open_connector(loaded, state_dir_for(loaded, args.state_dir)) as connector:
        report = hot_report(connector, args.top, args.hot_window, Printer(args.output == "json"))
    print_result(HotResult(report), args.output)
    if args.metrics_textfile is not None:
        write_hot_textfile(Path(args.metrics_textfile), loaded.spec.name, report)
    return EXIT_OK


def refuse_unread(findings: Sequence[Finding]) -> None:
    """A node the audit could not read (down, refusing the password, failing mid-scan) is an error, exit 1, not a
    finding's exit 4: the report printed above is incomplete, and a pipeline must not read it as a verdict."""
    from opsctl.base.events import plural
    from opsctl.observe.findings import UNREAD_RULE

    unread = sorted({f.node for f in findings if f.rule == UNREAD_RULE})
    if unread:
        raise OpsctlError(f"the audit could not read {plural(len(unread), 'node')} ({', '.join(unread)}): "
                          "its results are incomplete", "the report above says why for each (rule: reachable)",
                          "start or fix those nodes (`opsctl status -f SPEC` shows them), then audit again")


def register_audit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit", help="check running nodes against the hardened baseline and the key standard")
    add_spec_options(p, STATE_DIR_TUNNELS_HELP)
    add_fleet_options(p)
    p.add_argument("checks", nargs="*", type=_check_name, metavar="CHECK",
                   help=f"one or more of {', '.join(CHECK_CHOICES)} (default: all)")
    add_output(p, ("table", "json", "html"))
    scan = p.add_mutually_exclusive_group()
    scan.add_argument("--replicas-only", dest="allow_masters", action="store_false", default=False,
                      help="scan keys on replicas only (default)")
    scan.add_argument("--allow-masters", dest="allow_masters", action="store_true",
                      help="scan the master of a shard that has no replica")
    p.add_argument("--max-ops-per-sec", type=RATE, default=None, help="commands per second per scanned node")
    p.add_argument("--fail-on", choices=("info", "low", "medium", "high", "critical"), default="low",
                   help="exit 4 when a finding is at or above this severity (default: low)")
    p.add_argument("--count", type=ranged(int, 1, 1_000_000), default=1000, help="SCAN COUNT (default 1000)")
    p.add_argument("--batch", type=ranged(int, 1, 100_000), default=250,
                   help="keys per pipelined request (default 250)")
    p.add_argument("--window", type=ranged(int, 1, 1000), default=3, help="requests in flight per node (default 3)")
    p.add_argument("--nice", type=ranged(int, 0, 19), default=10,
                   help="lower opsctl's own CPU priority by N (default 10, 0 = off)")
    p.add_argument("--string-bytes", type=ranged(int, 1, 512 * 1024 * 1024), default=10240,
                   help="big string above this many bytes")
    p.add_argument("--elements", type=ranged(int, 1, 2**32), default=5000,
                   help="big collection above this many elements")
    p.add_argument("--top", type=ranged(int, 1, 10_000), default=10, help="top-N keys per type and shard")
    p.add_argument("--max-key-length", type=ranged(int, 1, 512 * 1024 * 1024), default=128)
    p.add_argument("--expiry-cluster", type=ranged(int, 1, 10**9), default=1000,
                   help="keys expiring in one second that count as "
                   "clustered")
    p.add_argument("--no-ttl-share", type=ranged(float, 0.0, 1.0), default=0.5,
                   help="flag a prefix above this share without TTL")
    p.add_argument("--no-ttl-min-keys", type=ranged(int, 1, 10**12), default=100,
                   help="ignore prefixes with fewer keys")
    p.add_argument("--hot", action="store_true",
                   help="cluster: each master's --top hottest slots by cpu over --hot-window (by keys where the "
                        "servers count no cpu per slot) and, where the maxmemory-policy is LFU, their hottest keys")
    p.add_argument("--hot-window", type=ranged(float, 0.5, 3600.0), default=5.0, metavar="SECONDS",
                   help="--hot: how long to measure (default 5)")
    p.add_argument("--metrics-textfile", metavar="DIR",
                   help="--hot: write the hottest slots per master to DIR/opsctl_<topology>_audit_hot.prom for "
                        "node_exporter's textfile collector (the dashboard's heat map reads it)")
    p.set_defaults(handler=_audit)


def _bigkey_delete(args: argparse.Namespace) -> int:
    from opsctl.audit.bigdelete import delete_big_key
    from opsctl.base.errors import echo
    from opsctl.cli.options import confirm
    from opsctl.cli.output import print_result
    from opsctl.cli.results import BigKeyDeleteResult
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    confirm(args, f"Delete the key {echo(args.key)} of '{loaded.spec.name}'? Its value is gone for good.")
    with open_connector(loaded, state_dir_for(loaded, args.state_dir)) as connector:
        result = delete_big_key(connector, args.key.encode("utf-8", "surrogateescape"), args.chunk, args.chunked,
                                args.dry_run, args.max_ops_per_sec)
    print_result(BigKeyDeleteResult(result, args.dry_run), args.output)
    return EXIT_OK


def register_bigkey(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bigkey", help="big-key operations")
    actions = p.add_subparsers(dest="bigkey_action", required=True, metavar="ACTION")
    d = actions.add_parser("delete", help="delete a big key without blocking the server")
    add_spec_options(d, STATE_DIR_TUNNELS_HELP, output=True)
    d.add_argument("key", metavar="KEY")
    add_dry_run(d, "show the plan, change nothing")
    add_auto_approve(d, "do not ask before deleting the key")
    d.add_argument("--chunked", action="store_true", help="rename and delete in chunks even when lazyfree is on")
    d.add_argument("--chunk", type=ranged(int, 1, 100_000), default=500, help="elements per delete step (default 500)")
    d.add_argument("--max-ops-per-sec", type=RATE, default=None, help="commands per second")
    d.set_defaults(handler=_bigkey_delete)


def audit_fleet(args: argparse.Namespace) -> int:
    from opsctl.base.events import HEARTBEAT
    from opsctl.cli.output import print_result
    from opsctl.cli.results import Audited
    from opsctl.fleet.summary import FleetResult, run_each

    refuse_with_folder(args, ("hot", "metrics_textfile"), "audit")
    if args.output == "html":
        raise OpsctlError("audit -f DIR prints a summary as text or json: --output html is one topology's page",
                          hint="use --output json (each topology's report), or audit -f SPEC --output html")
    fleet = fleet_of(args)
    options = audit_options(args)
    if args.nice > 0:
        os.nice(args.nice)  # a scan is background work: never take CPU from a server on the same host
    # node names are unique across the fleet: one bar counts every topology's keys
    bar = ProgressBar(heartbeat=None if sys.stderr.isatty() else HEARTBEAT) if args.output == "table" else None
    try:
        outcomes = run_each(lambda loaded: Audited(audit_report(loaded, None, options, bar.emit if bar else None),
                                                   args.fail_on), fleet.specs, args.parallel)
    finally:
        if bar:
            bar.close()
    result = FleetResult("audit", tuple(outcomes))
    if args.output == "table":  # each topology's findings as its own audit shows them, then the summary
        from opsctl.cli.results import AuditResult

        for outcome in outcomes:
            if outcome.result is not None and outcome.result.report.findings:
                print(f"== {outcome.name} ==\n{AuditResult(outcome.result.report, html=False).text()}\n")
    print_result(result, args.output)
    return worst_exit(result, lambda audited: audited.code)
