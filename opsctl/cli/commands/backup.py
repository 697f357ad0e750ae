"""`opsctl backup -f SPEC --to DIR|URL [--continuous]`, `opsctl backup verify DIR`, `opsctl backup list|prune`."""

from __future__ import annotations

import argparse
import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_OK, OpsctlError
from opsctl.cli.argtypes import ranged
from opsctl.cli.options import (
    STATE_DIR_TUNNELS_HELP,
    add_force_lock,
    add_metrics_textfile,
    add_output,
    add_spec_file,
    add_state_dir,
)
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.backup.save import BackupOptions
    from opsctl.backup.store import Store
    from opsctl.cli.output import Printer
    from opsctl.spec.load import LoadedSpec


def event_printer(json_mode: bool) -> AbstractContextManager[Printer]:
    """Events of backup and restore: JSON lines on stdout with --output json, the last one their result (its
    backup-done, verify-done, restore-done or restore-dry-run event, in the envelope); otherwise text on stderr,
    progress as a bar redrawn on a terminal, and the text result on stdout when done."""
    from opsctl.base.events import BackupDone, RestoreDone, VerifyDone
    from opsctl.cli.output import printing

    return printing(json_mode, sys.stdout if json_mode else sys.stderr, results=(BackupDone, VerifyDone, RestoreDone))


def cmd_backup(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _verify(args)
    if args.action in ("list", "prune"):
        return _catalog(args)
    if args.action is not None or not args.file or not args.to:
        raise OpsctlError("usage: opsctl backup -f SPEC --to DIR|URL [--continuous] | opsctl backup verify DIR | "
                          "opsctl backup list|prune --from DIR|URL", hint="opsctl backup --help shows every option")
    from opsctl.apply.connect import open_connector
    from opsctl.backup.offsite import open_store, staged_backup
    from opsctl.backup.save import BackupOptions
    from opsctl.backup.store import parse_location
    from opsctl.cli.output import print_text
    from opsctl.cli.results import BackupResult
    from opsctl.net.topolock import topology_lock
    from opsctl.state.specfile import read_spec
    from opsctl.state.statedir import state_dir_for

    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    json_mode = args.output == "json"
    options = BackupOptions(catch_up_timeout=args.catch_up_timeout, save_timeout=args.save_timeout)
    store = open_store(parse_location(args.to))  # boto3 missing: said before any node forks
    if args.continuous:
        return _continuous(args, loaded, state_dir, store, options)
    with open_connector(loaded, state_dir) as connector, topology_lock(connector, force=args.force_lock), \
            event_printer(json_mode) as emit, \
            staged_backup(connector, store, state_dir, emit, options) as (folder, manifest):
        where = store.where(folder.name)
    note_run(args, keys=manifest.total_keys)
    if not json_mode:  # as JSON, the result was the last event line
        print_text(BackupResult(where, manifest))
    return EXIT_OK


def _continuous(args: argparse.Namespace, loaded: LoadedSpec, state_dir: Path, store: Store,
                options: BackupOptions) -> int:
    """The archive in the foreground until stopped (SIGTERM/SIGINT: Stopped, exit 143/130); the topology lock is
    held only while a base is taken, so reshards and failovers run beside it."""
    from opsctl.apply.connect import open_connector
    from opsctl.backup.archive import ArchiveOptions, run_archive
    from opsctl.net.topolock import topology_lock

    every = args.base_every * 3600 if args.base_every else None
    archive = ArchiveOptions(args.segment_seconds, args.segment_bytes, args.reconnect_timeout, every, options)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open_connector(loaded, state_dir) as connector, event_printer(args.output == "json") as emit:
        run_archive(connector, store, state_dir, emit, archive, lambda: topology_lock(connector, force=args.force_lock))
    return EXIT_OK


def _catalog(args: argparse.Namespace) -> int:
    """backup list / prune --from DIR|URL."""
    from opsctl.backup.catalog import catalog, prune
    from opsctl.backup.offsite import open_store
    from opsctl.backup.store import parse_location
    from opsctl.cli.output import print_result
    from opsctl.cli.results import CatalogResult

    if not args.from_ or args.file or args.to or (args.action == "prune" and args.keep_days is None):
        raise OpsctlError(f"usage: opsctl backup {args.action} --from DIR|URL"
                          + (" --keep-days N" if args.action == "prune" else ""),
                          hint="--from names the location backups went to (--to), a folder or s3://BUCKET/PREFIX")
    store = open_store(parse_location(args.from_))
    dropped = tuple(prune(store, args.keep_days)) if args.action == "prune" else None
    print_result(CatalogResult(store.location.text, tuple(catalog(store)), dropped), args.output)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from opsctl.backup.offsite import fetched
    from opsctl.backup.verify import verify_backup
    from opsctl.base.events import VerifyDone
    from opsctl.cli.output import print_text
    from opsctl.cli.results import VerifyResult

    if not args.target or args.file or args.to:
        raise OpsctlError("usage: opsctl backup verify DIR|URL",
                          hint="a backup directory (it holds manifest.json), or s3://BUCKET/PREFIX/<name>-<time>")
    json_mode = args.output == "json"
    with event_printer(json_mode) as emit, fetched(args.target, None) as (folder, _):
        manifest = verify_backup(folder, emit)
        emit(VerifyDone(True, manifest.total_keys))
    if not json_mode:  # as JSON, the result was the verify-done line
        print_text(VerifyResult(args.target, manifest))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backup", help="save one RDB per shard with a manifest; `backup verify DIR` checks one",
                       description="opsctl backup -f SPEC --to DIR|s3://BUCKET/PREFIX [--continuous]   |   "
                                   "opsctl backup verify DIR   |   opsctl backup list|prune --from DIR|URL")
    p.add_argument("action", nargs="?", choices=("verify", "list", "prune"),
                   help="verify: check a backup directory; list: what a location holds; prune: drop what is "
                        "older than --keep-days")
    p.add_argument("target", nargs="?", metavar="DIR|URL", help="the backup (directory or s3:// URL) to verify")
    add_spec_file(p, required=False)  # not with `backup verify DIR`
    add_force_lock(p)
    p.add_argument("--to", metavar="DIR|s3://BUCKET/PREFIX",
                   help="directory (or S3 bucket prefix: boto3's AWS configuration) that receives "
                        "<name>-<UTC timestamp>/")
    p.add_argument("--from", dest="from_", metavar="DIR|URL", help="the location `backup list` and `prune` read")
    p.add_argument("--keep-days", type=ranged(float, 0, 36500),
                   help="backup prune: keep what a restore to any time of the last N days needs")
    p.add_argument("--continuous", action="store_true",
                   help="after the base backup, archive every shard's replication stream until stopped")
    p.add_argument("--segment-seconds", type=ranged(float, 0.1, 60), default=1.0,
                   help="--continuous: close a segment this long after its first command (default 1)")
    p.add_argument("--segment-bytes", type=ranged(int, 4096, 1 << 30), default=8 << 20,
                   help="--continuous: or once it holds this many bytes (default 8 MiB)")
    p.add_argument("--base-every", type=ranged(float, 0.001, 8760), metavar="HOURS",
                   help="--continuous: take a new base this often while the streams go on (restores download less, "
                        "prune drops more; default: only at start and after a gap)")
    p.add_argument("--reconnect-timeout", type=ranged(float, 1, 3600), default=120.0,
                   help="--continuous: seconds to find a shard's master again after its stream broke (default 120)")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.add_argument("--catch-up-timeout", type=ranged(float, 1, 3600), default=60.0,
                   help="seconds a replica may take to reach its master's offset before saving (default 60)")
    p.add_argument("--save-timeout", type=ranged(float, 1, 86400), default=3600.0,
                   help="seconds a node may take to send its copy (default 3600)")
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("backup", cmd_backup))
