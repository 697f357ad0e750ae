"""`opsctl backup -f SPEC --to DIR` and `opsctl backup verify DIR`."""

from __future__ import annotations

import argparse
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

    from opsctl.backup.save import Fetch
    from opsctl.cli.output import Printer
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
    from opsctl.backup.save import BackupOptions, run_backup
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
    with open_connector(loaded, state_dir) as connector, topology_lock(connector), \
            fetcher(loaded, state_dir) as fetch, event_printer(json_mode) as emit:
        folder, manifest = run_backup(connector, Path(args.to), fetch, emit, options)
    note_run(args, keys=manifest.total_keys)
    if not json_mode:  # as JSON, the result was the last event line
        print_text(BackupResult(str(folder), manifest))
    return EXIT_OK


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
    p.add_argument("--to", help="directory that receives <name>-<UTC timestamp>/")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.add_argument("--catch-up-timeout", type=ranged(float, 1, 3600), default=60.0,
                   help="seconds a replica may take to reach its master's offset before saving (default 60)")
    p.add_argument("--save-timeout", type=ranged(float, 1, 86400), default=3600.0,
                   help="seconds a BGSAVE may take (default 3600)")
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("backup", cmd_backup))
