"""`opsctl backup -f SPEC --to DIR|URL [--continuous]`, `opsctl backup verify|list|prune --from DIR|URL`.

A location written is --to, a location read is --from (as restore and migrate take theirs); `backup verify DIR`,
the spelling documented first, stays an alias."""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError, echo
from opsctl.cli.commands.fleetrun import add_fleet_options, fleet_of, is_folder, refuse_with_folder
from opsctl.cli.options import (
    STATE_DIR_TUNNELS_HELP,
    add_force_lock,
    add_metrics_textfile,
    add_output,
    add_spec_file,
    add_state_dir,
    ranged,
)
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.backup.save import BackupOptions
    from opsctl.backup.store import Store
    from opsctl.base.events import Event
    from opsctl.cli.output import Printer
    from opsctl.cli.results import Backed
    from opsctl.spec.load import LoadedSpec


def event_printer(json_mode: bool) -> AbstractContextManager[Printer]:
    """Events of backup and restore: JSON lines on stdout with --output json, the last one their result (its
    backup-done, verify-done, restore-done, restore-dry-run or, ending backup --continuous, archive-stopped event,
    in the envelope); otherwise text on stderr, progress as a bar redrawn on a terminal, and the text result on
    stdout when done."""
    from opsctl.backup.follow import ArchiveStopped
    from opsctl.backup.integrity import VerifyDone
    from opsctl.backup.save import BackupDone
    from opsctl.cli.output import printing
    from opsctl.restore.copying import RestoreDone

    return printing(json_mode, sys.stdout if json_mode else sys.stderr,
                    results=(BackupDone, VerifyDone, RestoreDone, ArchiveStopped))


CONTINUOUS = {"segment_seconds": 1.0, "segment_bytes": 8 << 20, "base_every": None, "reconnect_timeout": 120.0}
SAVING = {"catch_up_timeout": 60.0, "save_timeout": 3600.0}


def check_mode(args: argparse.Namespace) -> None:
    """Options of another mode refused, not ignored (before anything is read); the defaults filled in."""
    from opsctl.cli.options import fill_defaults, refuse_given

    if args.target is not None and args.action != "verify":  # verify's alone: its documented spelling first
        import shlex

        from opsctl.base.secrets import mask_url

        action, shown = args.action or "verify|list|prune", shlex.quote(mask_url(args.target[:500]))
        raise OpsctlError(f"{echo(args.target)}: `backup {action}` reads its location from --from (only `backup "
                          "verify` also takes it alone)", hint=f"opsctl backup {action} --from {shown}")
    if args.action is None:
        refuse_given(args, ("from_", "keep_days"), "`backup list|prune`, not with a backup",
                     "opsctl backup -f SPEC --to DIR|URL takes --to, not --from")
        if not args.continuous:
            refuse_given(args, tuple(CONTINUOUS), "--continuous", "add --continuous, or drop the option")
    else:
        saving = ("continuous", *CONTINUOUS, *SAVING, "state_dir", "metrics_textfile", "force_lock")
        refuse_given(args, saving, f"a backup (-f SPEC --to DIR|URL), not with `backup {args.action}`",
                     "drop the option")
        if args.action != "prune":
            refuse_given(args, ("keep_days",), "`backup prune`", "drop the option")
    fill_defaults(args, {**CONTINUOUS, **SAVING})


def cmd_backup(args: argparse.Namespace) -> int:
    check_mode(args)
    if args.action == "verify":
        return _verify(args)
    if args.action in ("list", "prune"):
        return _catalog(args)
    if args.action is not None or not args.file or not args.to:
        raise OpsctlError("usage: opsctl backup -f SPEC --to DIR|URL [--continuous] | "
                          "opsctl backup verify|list|prune --from DIR|URL",
                          hint="opsctl backup --help shows every option")
    if is_folder(args):  # each topology of the folder under --to's <topology>/
        return backup_fleet(args)
    from opsctl.backup.offsite import open_store, staged_backup
    from opsctl.backup.save import BackupOptions
    from opsctl.backup.store import parse_location
    from opsctl.cli.output import Printer, print_text
    from opsctl.cli.results import BackupResult
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    json_mode = args.output == "json"
    options = BackupOptions(catch_up_timeout=args.catch_up_timeout, save_timeout=args.save_timeout)
    store = open_store(parse_location(args.to), probe="write")  # no bucket, no access: said before any fork
    if args.continuous:
        return _continuous(args, loaded, state_dir, store, options)
    lock_notes = Printer(json_mode)  # a forced or taken-over lock, said on stderr
    with open_connector(loaded, state_dir) as connector, \
            topology_lock(connector, force=args.force_lock, emit=lock_notes), event_printer(json_mode) as emit, \
            staged_backup(connector, store, state_dir, emit, options) as (folder, manifest):
        where = store.where(folder.name)
    note_run(args, keys=manifest.total_keys)
    if not json_mode:  # as JSON, the result was the last event line
        print_text(BackupResult(where, manifest))
    return EXIT_OK


def _continuous(args: argparse.Namespace, loaded: LoadedSpec, state_dir: Path, store: Store,
                options: BackupOptions) -> int:
    """The archive in the foreground until stopped, as a service is: SIGTERM/SIGINT close every open segment and end
    it normally, exit 0 with a closing line (a second signal stops at once: exit 143/130). The topology lock is
    held only while a base is taken, so reshards and failovers run beside it. The spec file is read and placed again
    every few seconds: the archive follows the fleet `apply` changes (a spec from stdin: the nodes placed now)."""
    from opsctl.backup.archive import ArchiveOptions, run_archive
    from opsctl.backup.follow import ArchiveStopped
    from opsctl.base import stop
    from opsctl.cli.output import Printer
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import fleet_placer, open_connector

    every = args.base_every * 3600 if args.base_every else None
    archive = ArchiveOptions(args.segment_seconds, args.segment_bytes, args.reconnect_timeout, every, options)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ended = None
    with open_connector(loaded, state_dir) as connector, event_printer(args.output == "json") as emit:
        try:
            run_archive(connector, store, state_dir, emit, archive,
                        lambda: topology_lock(connector, force=args.force_lock, emit=Printer(args.output == "json")),
                        None if args.file == "-" else fleet_placer(args.file, state_dir, connector))
        except stop.Stopped as stopped:
            if not stop.asked_once():
                raise
            ended = ArchiveStopped(signal.Signals(stopped.signum).name, stopped.detail or "nothing was left open")
            if args.output == "json":
                emit(ended)  # the last JSON line, in the envelope
    if ended is not None and args.output != "json":
        print(ended.line())  # the result, on stdout like every command's (progress stays on stderr)
    return EXIT_OK


def _catalog(args: argparse.Namespace) -> int:
    """backup list / prune --from DIR|URL."""
    from opsctl.backup.offsite import open_store
    from opsctl.backup.store import parse_location
    from opsctl.backup.timeline import catalog, prune
    from opsctl.cli.output import print_result
    from opsctl.cli.results import CatalogResult

    if not args.from_ or args.file or args.to or (args.action == "prune" and args.keep_days is None):
        raise OpsctlError(f"usage: opsctl backup {args.action} --from DIR|URL"
                          + (" --keep-days N" if args.action == "prune" else ""),
                          hint="--from names the location backups went to (--to), a folder or s3://BUCKET/PREFIX")
    store = open_store(parse_location(args.from_), probe="read")  # a location that is not there is no empty one
    dropped = tuple(prune(store, args.keep_days)) if args.action == "prune" else None
    print_result(CatalogResult(store.location.text, tuple(catalog(store)), dropped), args.output)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from opsctl.backup.integrity import VerifyDone, verify_backup
    from opsctl.backup.offsite import fetched
    from opsctl.cli.output import print_text
    from opsctl.cli.results import VerifyResult

    if not (args.target or args.from_) or (args.target and args.from_) or args.file or args.to:
        raise OpsctlError("usage: opsctl backup verify --from DIR|URL (or the location alone: backup verify DIR)",
                          hint="a backup directory (it holds manifest.json), or s3://BUCKET/PREFIX/<name>-<time>")
    location = args.from_ or args.target
    json_mode = args.output == "json"
    with event_printer(json_mode) as emit, fetched(location, None) as (folder, _):
        manifest = verify_backup(folder, emit)
        emit(VerifyDone(True, manifest.total_keys))
    if not json_mode:  # as JSON, the result was the verify-done line
        print_text(VerifyResult(location, manifest))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backup", help="save one RDB per shard with a manifest; `backup verify --from DIR` checks one",
                       description="opsctl backup -f SPEC --to DIR|s3://BUCKET/PREFIX [--continuous]   |   "
                                   "opsctl backup verify|list|prune --from DIR|URL")
    p.add_argument("action", nargs="?", choices=("verify", "list", "prune"),
                   help="verify: check a backup directory; list: what a location holds; prune: drop what is "
                        "older than --keep-days")
    p.add_argument("target", nargs="?", metavar="DIR|URL", help="backup verify: the same as --from DIR|URL")
    add_spec_file(p, required=False)  # not with `backup verify|list|prune`
    add_fleet_options(p)
    add_force_lock(p)
    p.add_argument("--to", metavar="DIR|s3://BUCKET/PREFIX",
                   help="directory (or S3 bucket prefix: boto3's AWS configuration) that receives "
                        "<name>-<UTC timestamp>/")
    p.add_argument("--from", dest="from_", metavar="DIR|URL",
                   help="the location `backup verify` (a backup), `list` and `prune` (where backups went) read")
    p.add_argument("--keep-days", type=ranged(float, 0, 36500),
                   help="backup prune: keep what a restore to any time of the last N days needs")
    p.add_argument("--continuous", action="store_true",
                   help="after the base backup, archive every shard's replication stream until stopped")
    p.add_argument("--segment-seconds", type=ranged(float, 0.1, 60),
                   help="--continuous: close a segment this long after its first command (default 1)")
    p.add_argument("--segment-bytes", type=ranged(int, 4096, 1 << 30),
                   help="--continuous: or once it holds this many bytes (default 8 MiB)")
    p.add_argument("--base-every", type=ranged(float, 0.001, 8760), metavar="HOURS",
                   help="--continuous: take a new base this often while the streams go on (restores download less, "
                        "prune drops more; default: only at start and after a gap)")
    p.add_argument("--reconnect-timeout", type=ranged(float, 1, 3600),
                   help="--continuous: seconds to find a shard's master again after its stream broke (default 120)")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.add_argument("--catch-up-timeout", type=ranged(float, 1, 3600),
                   help="seconds a replica may take to reach its master's offset before saving (default 60)")
    p.add_argument("--save-timeout", type=ranged(float, 1, 86400),
                   help="seconds a node may take to send its copy (default 3600)")
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("backup", cmd_backup))


def backup_fleet(args: argparse.Namespace) -> int:
    """backup -f DIR --to LOCATION: each topology into LOCATION/<topology>/ (a folder or an S3 prefix)."""
    from opsctl.backup.offsite import open_store
    from opsctl.backup.store import parse_location
    from opsctl.cli.output import Printer, print_result
    from opsctl.fleet.summary import FleetResult, run_each

    refuse_with_folder(args, ("continuous", "metrics_textfile"), "backup")
    location = parse_location(args.to)
    fleet = fleet_of(args)
    # every topology's location probed before any backup starts: a wrong one changes nothing
    stores = {s.spec.name: open_store(location.child(s.spec.name), probe="write") for s in fleet.specs}
    printer = None if args.output == "json" else Printer(False)  # progress on stderr, tagged by topology

    def one(loaded: LoadedSpec) -> Backed:
        return _backup_one(loaded, stores[loaded.spec.name], args, printer)

    try:
        result = FleetResult("backup", tuple(run_each(one, fleet.specs, args.parallel)))
    finally:
        if printer is not None:
            printer.close()
    print_result(result, args.output)
    return EXIT_ERROR if result.failed else EXIT_OK


def _backup_one(loaded: LoadedSpec, store: Store, args: argparse.Namespace, printer: Printer | None) -> Backed:
    """One topology's backup, as `backup -f SPEC --to` takes it: under its lock, the result event kept."""
    from opsctl.backup.offsite import staged_backup
    from opsctl.backup.save import BackupDone, BackupOptions
    from opsctl.base.events import Tagged
    from opsctl.cli.results import Backed
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for

    done: list[BackupDone] = []
    name = loaded.spec.name

    def emit(event: Event) -> None:
        if isinstance(event, BackupDone):
            done.append(event)
        if printer is not None:
            printer(Tagged(name, event))

    state_dir = state_dir_for(loaded, None)
    options = BackupOptions(catch_up_timeout=args.catch_up_timeout, save_timeout=args.save_timeout)
    with open_connector(loaded, state_dir) as connector, topology_lock(connector, force=args.force_lock), \
            staged_backup(connector, store, state_dir, emit, options) as (folder, manifest):
        where = store.where(folder.name)
    return Backed(where, manifest, done[-1] if done else None)
