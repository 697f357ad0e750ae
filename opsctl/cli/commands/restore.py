"""`opsctl restore -f SPEC (--from DIR | --from-live SOURCE_SPEC)`: keys into a running topology of any shape."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.commands.backup import event_printer
from opsctl.cli.options import (
    STATE_DIR_TUNNELS_HELP,
    add_auto_approve,
    add_dry_run,
    add_force_lock,
    add_metrics_textfile,
    add_output,
    add_spec_file,
    add_state_dir,
    ranged,
)
from opsctl.cli.runsignals import note_run, recorded

if TYPE_CHECKING:
    from opsctl.backup.manifest import ShardFile
    from opsctl.restore.sources import Prepared, RestoreOptions
    from opsctl.restore.target import Target
    from opsctl.spec.load import LoadedSpec


def cmd_restore(args: argparse.Namespace) -> int:
    from opsctl.cli.options import confirm
    from opsctl.cli.output import Printer
    from opsctl.net.topolock import topology_lock
    from opsctl.restore.copying import RestoreDryRun, run_restore
    from opsctl.restore.sources import RestoreOptions
    from opsctl.restore.target import inspect_target
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.statelock import state_lock

    until = _until(args)
    _check_options(args)
    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    if args.mode == "replace":
        confirm(args, f"Overwrite the keys of '{loaded.spec.name}' that the source also holds? Their values are lost.")
    if args.from_dir:  # before any lock: a source that is not there blames no run, and nothing is touched
        from opsctl.backup.offsite import open_store
        from opsctl.backup.store import parse_location

        open_store(parse_location(args.from_dir), probe="read")
    state_dir = state_dir_for(loaded, args.state_dir)
    options = RestoreOptions(args.mode, args.dry_run, args.verify, args.sample)
    json_mode = args.output == "json"
    with ExitStack() as stack:
        if not args.dry_run:  # a dry run reads the journal (replaced whole, never half-written) and writes nothing
            stack.enter_context(state_lock(state_dir))
        connector = stack.enter_context(open_connector(loaded, state_dir))
        if not args.dry_run:  # one run per target topology, whatever its state dir
            stack.enter_context(topology_lock(connector, force=args.force_lock, emit=Printer(json_mode)))
        target = inspect_target(connector)
        prepared = _sources(args, stack, loaded, target, state_dir, options, until)
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


def _sources(args: argparse.Namespace, stack: ExitStack, loaded: LoadedSpec, target: Target, state_dir: Path,
             options: RestoreOptions, until: float | None) -> Prepared:
    """The sources a restore reads, entered on stack: a backup replayed to a time, a backup, or a live topology
    (locked, unless a dry run, so that no run reshards, fails over or restarts it while it is read)."""
    from opsctl.cli.output import Printer
    from opsctl.net.topolock import topology_lock
    from opsctl.restore.sources import backup_sources, live_sources, refuse_same_servers
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    if until is not None:
        return stack.enter_context(to_time(args.from_dir, until, target, state_dir, options))
    if args.from_dir:
        from opsctl.backup.offsite import fetched

        folder, origin = stack.enter_context(fetched(args.from_dir, state_dir))
        return stack.enter_context(backup_sources(folder, target, options, origin))
    source = read_spec(args.from_live)
    refuse_same_servers(loaded, source)  # before the source's lock, which would meet this run's own
    source_connector = stack.enter_context(open_connector(source, state_dir_for(source, None)))
    if not args.dry_run:
        stack.enter_context(topology_lock(source_connector, force=args.force_lock,
                                                     emit=Printer(args.output == "json")))
    return stack.enter_context(live_sources(source_connector, target, options))


def _check_options(args: argparse.Namespace) -> None:
    """Options of another mode refused, not ignored: --sample counts keys for --verify sample only."""
    from opsctl.cli.options import fill_defaults, refuse_given

    if args.verify != "sample":
        refuse_given(args, ("sample",), "--verify sample (the default), not --verify full",
                     "drop --sample: --verify full compares every key")
    fill_defaults(args, {"sample": 1000})


def _until(args: argparse.Namespace) -> float | None:
    """--to-time as a unix time, checked before anything is opened; it needs --from (an archive location)."""
    if not args.to_time:
        return None
    from opsctl.backup.timeline import parse_time

    if not args.from_dir:
        raise OpsctlError("--to-time restores from an archive, not from a running topology",
                          hint="--from DIR|s3://BUCKET/PREFIX: where `backup --continuous` archives")
    return parse_time(args.to_time)


@contextmanager
def to_time(source: str, until: float, target: Target, state_dir: Path,
            options: RestoreOptions) -> Iterator[Prepared]:
    """An archive location restored to a time: every segment needed fetched and checked first (a damaged one is
    refused by name before anything is written), then the base, each shard's commands replayed into its scratch
    server; the report names the exact point per shard."""
    import tempfile

    from opsctl.backup.offsite import download_backup, open_store
    from opsctl.backup.store import parse_location
    from opsctl.backup.timeline import iso
    from opsctl.restore.pitr import plan_to_time, replay
    from opsctl.restore.sources import backup_sources

    store = open_store(parse_location(source), probe="read")
    plan = plan_to_time(store, until)

    def replayed(shard: ShardFile, socket_path: str) -> None:
        replay(socket_path, f"shard-{shard.shard}", plan.replays.get(shard.shard, []))

    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".restore-", dir=state_dir) as into:
        folder = download_backup(store, plan.base.name, Path(into))
        origin = store.where(plan.base.name)
        with backup_sources(folder, target, options, origin, replayed) as prepared:
            prepared.id += f"@{iso(until)}"
            prepared.text += plan.text()
            yield prepared


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restore", help="copy a backup or a running topology into the topology SPEC describes")
    add_spec_file(p, about="the target's topology spec (YAML)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="from_dir", metavar="DIR|URL",
                        help="a backup directory (holds manifest.json), or s3://BUCKET/PREFIX/<name>-<time>")
    source.add_argument("--from-live", metavar="SOURCE_SPEC", help="the spec of a running topology to copy from")
    p.add_argument("--to-time", metavar="TIME",
                   help="with --from an archive location (backup --continuous): restore to this ISO time, e.g. "
                        "2026-11-27T14:01:00Z")
    p.add_argument("--mode", choices=("fail-if-exists", "replace", "skip-existing"), default="fail-if-exists",
                   help="keys that already exist on the target: refuse before writing (default), overwrite, or keep")
    add_dry_run(p, "run every check, write nothing")
    add_auto_approve(p, "do not ask (--mode replace asks before overwriting keys)")
    add_force_lock(p)
    p.add_argument("--verify", choices=("sample", "full"), default="sample",
                   help="after the copy compare a sample of keys (default) or every key with the source")
    p.add_argument("--sample", type=ranged(int, 1, 10_000_000),
                   help="keys per source compared with --verify sample (default 1000)")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    add_metrics_textfile(p)
    p.set_defaults(handler=recorded("restore", cmd_restore))
