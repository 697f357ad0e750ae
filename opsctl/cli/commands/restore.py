"""`opsctl restore -f SPEC (--from DIR | --from-live SOURCE_SPEC)`: keys into a running topology of any shape."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from opsctl.base.errors import EXIT_ERROR, EXIT_OK
from opsctl.cli.argtypes import ranged
from opsctl.cli.commands.backup import event_printer
from opsctl.cli.options import (
    STATE_DIR_TUNNELS_HELP,
    add_auto_approve,
    add_dry_run,
    add_metrics_textfile,
    add_output,
    add_spec_file,
    add_state_dir,
)
from opsctl.cli.runsignals import note_run, recorded


def cmd_restore(args: argparse.Namespace) -> int:
    from opsctl.apply.connect import open_connector
    from opsctl.base.events import RestoreDryRun
    from opsctl.cli.confirm import confirm
    from opsctl.net.topolock import topology_lock
    from opsctl.restore.run import run_restore
    from opsctl.restore.sources import RestoreOptions, backup_sources, live_sources, refuse_same_servers
    from opsctl.restore.target import inspect_target
    from opsctl.state.specfile import read_spec
    from opsctl.state.statedir import state_dir_for
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    if args.mode == "replace":
        confirm(args, f"Overwrite the keys of '{loaded.spec.name}' that the source also holds? Their values are lost.")
    state_dir = state_dir_for(loaded, args.state_dir)
    options = RestoreOptions(args.mode, args.dry_run, args.verify, args.sample)
    json_mode = args.output == "json"
    with ExitStack() as stack:
        if not args.dry_run:  # a dry run reads the journal (replaced whole, never half-written) and writes nothing
            stack.enter_context(state_lock(state_dir))
        connector = stack.enter_context(open_connector(loaded, state_dir))
        if not args.dry_run:  # one run per target topology, whatever its state dir
            stack.enter_context(topology_lock(connector))
        target = inspect_target(connector)
        if args.from_dir:
            from pathlib import Path

            prepared = stack.enter_context(backup_sources(Path(args.from_dir), target, options))
        else:
            source = read_spec(args.from_live)
            refuse_same_servers(loaded, source)  # before the source's lock, which would meet this run's own
            source_connector = stack.enter_context(open_connector(source, state_dir_for(source, None)))
            if not args.dry_run:  # no run reshards, fails over or restarts the source while it is read
                stack.enter_context(topology_lock(source_connector))
            prepared = stack.enter_context(live_sources(source_connector, target, options))
        emit = stack.enter_context(event_printer(json_mode))
        report = run_restore(target, prepared, state_dir, options, emit)
        note_run(args, keys=report.done().restored)
        if report.dry_run:
            emit(report.done(RestoreDryRun))
    if not json_mode:  # as JSON, the result was the last event line
        from opsctl.cli.output import print_text
        from opsctl.cli.results import RestoreResult

        print_text(RestoreResult(report.done()))
    return EXIT_ERROR if report.problems else EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restore", help="copy a backup or a running topology into the topology SPEC describes")
    add_spec_file(p, about="the target's topology spec (YAML)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="from_dir", metavar="DIR", help="a backup directory (holds manifest.json)")
    source.add_argument("--from-live", metavar="SOURCE_SPEC", help="the spec of a running topology to copy from")
    p.add_argument("--mode", choices=("fail-if-exists", "replace", "skip-existing"), default="fail-if-exists",
                   help="keys that already exist on the target: refuse before writing (default), overwrite, or keep")
    add_dry_run(p, "run every check, write nothing")
    add_auto_approve(p, "do not ask (--mode replace asks before overwriting keys)")
    p.add_argument("--verify", choices=("sample", "full"), default="sample",
                   help="after the copy compare a sample of keys (default) or every key with the source")
    p.add_argument("--sample", type=ranged(int, 1, 10_000_000), default=1000,
                   help="keys per source compared with --verify sample (default 1000)")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("restore", cmd_restore))
