"""`opsctl backup -f SPEC --to DIR` and `opsctl backup verify DIR`."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_OK, OpsctlError
from opsctl.cli.argtypes import ranged
from opsctl.cli.options import STATE_DIR_TUNNELS_HELP, add_metrics_textfile, add_output, add_spec_file, add_state_dir
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.backup.manifest import Manifest
    from opsctl.backup.save import BackupOptions, Fetch
    from opsctl.backup.store import Store
    from opsctl.base.events import Emit
    from opsctl.cli.output import Printer
    from opsctl.net.connector import Connector
    from opsctl.spec.load import LoadedSpec


def event_printer(json_mode: bool) -> AbstractContextManager[Printer]:
    """Events of backup and restore: JSON lines on stdout with --output json, the last one their result (its
    backup-done, verify-done, restore-done or restore-dry-run event, in the envelope); otherwise text on stderr,
    progress as a bar redrawn on a terminal, and the text result on stdout when done."""
    from opsctl.base.events import BackupDone, RestoreDone, VerifyDone
    from opsctl.cli.output import printing

    return printing(json_mode, sys.stdout if json_mode else sys.stderr, results=(BackupDone, VerifyDone, RestoreDone))


@contextmanager
def fetcher(loaded: LoadedSpec, state_dir: Path) -> Iterator[Fetch]:
    """How RDB files come here: a file copy (local provider) or SFTP over the provider's SSH connection."""
    from opsctl.backup.save import local_fetch

    if loaded.spec.provider != "ansible":
        yield local_fetch
        return
    from opsctl.providers.ansible import AnsibleProvider

    provider = AnsibleProvider(loaded, state_dir)
    try:
        yield provider.fetch_file
    finally:
        provider.close()


def cmd_backup(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _verify(args)
    if args.action is not None or not args.file or not args.to:
        raise OpsctlError("usage: opsctl backup -f SPEC --to DIR | opsctl backup verify DIR",
                          hint="opsctl backup --help shows every option")
    from pathlib import Path

    from opsctl.apply.connect import open_connector
    from opsctl.backup.offsite import open_store, staging_dir
    from opsctl.backup.save import BackupOptions, run_backup
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
    location = parse_location(args.to)
    store = open_store(location) if location.remote else None  # boto3 missing: said before any BGSAVE
    with open_connector(loaded, state_dir) as connector, topology_lock(connector), \
            fetcher(loaded, state_dir) as fetch, event_printer(json_mode) as emit:
        if store is None:
            folder, manifest = run_backup(connector, Path(args.to), fetch, emit, options)
            where = str(folder)
        else:
            folder, manifest, where = _offsite(store, connector, staging_dir(state_dir), fetch, emit, options)
    note_run(args, keys=manifest.total_keys)
    if not json_mode:  # as JSON, the result was the last event line
        print_text(BackupResult(where, manifest))
    return EXIT_OK


def _offsite(store: Store, connector: Connector, staging: Path, fetch: Fetch, emit: Emit,
             options: BackupOptions) -> tuple[Path, Manifest, str]:
    """A backup staged in a private folder, then uploaded: its backup-done event (the result) is held back until
    the upload finished and names the URL; the staged copy is removed whatever happened."""
    from dataclasses import replace

    from opsctl.backup.offsite import upload_backup
    from opsctl.backup.save import run_backup
    from opsctl.base.events import BackupDone, Event

    done: list[BackupDone] = []

    def held(event: Event) -> None:
        if isinstance(event, BackupDone):
            done.append(event)
        else:
            emit(event)

    try:
        folder, manifest = run_backup(connector, staging, fetch, held, options)
        where = upload_backup(store, folder, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    emit(replace(done[0], dir=where))
    return folder, manifest, where


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from opsctl.backup.verify import verify_backup
    from opsctl.base.events import VerifyDone
    from opsctl.cli.output import print_text
    from opsctl.cli.results import VerifyResult

    if not args.target or args.file or args.to:
        raise OpsctlError("usage: opsctl backup verify DIR", hint="DIR is a backup directory (it holds manifest.json)")
    json_mode = args.output == "json"
    with event_printer(json_mode) as emit:
        manifest = verify_backup(Path(args.target), emit)
        emit(VerifyDone(True, manifest.total_keys))
    if not json_mode:  # as JSON, the result was the verify-done line
        print_text(VerifyResult(args.target, manifest))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backup", help="save one RDB per shard with a manifest; `backup verify DIR` checks one",
                       description="opsctl backup -f SPEC --to DIR   |   opsctl backup verify DIR")
    p.add_argument("action", nargs="?", choices=("verify",), help="verify: check a backup directory")
    p.add_argument("target", nargs="?", metavar="DIR", help="the backup directory to verify")
    add_spec_file(p, required=False)  # not with `backup verify DIR`
    p.add_argument("--to", metavar="DIR|s3://BUCKET/PREFIX",
                   help="directory (or S3 bucket prefix: boto3's AWS configuration) that receives "
                        "<name>-<UTC timestamp>/")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.add_argument("--catch-up-timeout", type=ranged(float, 1, 3600), default=60.0,
                   help="seconds a replica may take to reach its master's offset before saving (default 60)")
    p.add_argument("--save-timeout", type=ranged(float, 1, 86400), default=3600.0,
                   help="seconds a BGSAVE may take (default 3600)")
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("backup", cmd_backup))
