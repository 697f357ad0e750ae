"""`opsctl migrate -f TARGET_SPEC --from SOURCE_SPEC` (live migration) and `opsctl migrate cutover -f TARGET_SPEC`
(asks the running migration to cut over, from another terminal, and prints its report)."""

from __future__ import annotations

import argparse
import sys
import time

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.argtypes import ranged
from opsctl.cli.options import STATE_DIR_TUNNELS_HELP, add_auto_approve, add_output, add_spec_file, add_state_dir
from opsctl.cli.runsignals import note_run, recorded

CUTOVER_WAIT = 120.0


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.action == "cutover":
        return _request_cutover(args)
    if not args.from_spec:
        raise OpsctlError("opsctl migrate needs --from SOURCE_SPEC", hint="opsctl migrate -f TARGET --from SOURCE")
    from contextlib import ExitStack

    from opsctl.apply.connect import open_connector
    from opsctl.base.events import CutoverDone, Event
    from opsctl.cli.confirm import confirm
    from opsctl.cli.output import printing
    from opsctl.migrate.run import MigrateOptions, run_migrate
    from opsctl.net.topolock import topology_lock
    from opsctl.state.specfile import read_spec
    from opsctl.state.statedir import state_dir_for
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    source = read_spec(args.from_spec)
    note_run(args, loaded.spec.name)
    confirm(args, f"Migrate '{source.spec.name}' into '{loaded.spec.name}' (the target must be empty)?")
    state_dir = state_dir_for(loaded, args.state_dir)
    options = MigrateOptions(args.cutover, args.lag_bound, args.sample)
    with ExitStack() as stack:
        stack.enter_context(state_lock(state_dir))
        target_connector = stack.enter_context(open_connector(loaded, state_dir))
        stack.enter_context(topology_lock(target_connector))
        source_connector = stack.enter_context(open_connector(source, state_dir_for(source, None)))
        stack.enter_context(topology_lock(source_connector))  # no opsctl run reshards the source meanwhile
        json_mode = args.output == "json"
        printer = stack.enter_context(printing(json_mode, sys.stdout if json_mode else sys.stderr, (CutoverDone,)))

        def emit(event: Event) -> None:  # as text, the report goes to stdout at the end, not among the events
            if json_mode or not isinstance(event, CutoverDone):
                printer(event)
        report = run_migrate(source_connector, target_connector, state_dir, options, emit)
    if not json_mode:
        print(report.line())
    return EXIT_OK if report.ok else EXIT_ERROR


def _request_cutover(args: argparse.Namespace) -> int:
    """Leave the request file for the running migration, then wait for its report file."""
    from opsctl.migrate.journal import REQUEST, RESULT
    from opsctl.state.safefs import read_bounded, write_private
    from opsctl.state.specfile import read_spec
    from opsctl.state.statedir import state_dir_for
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    state_dir = state_dir_for(loaded, args.state_dir)
    try:
        with state_lock(state_dir):
            raise OpsctlError(f"no migration into '{loaded.spec.name}' is running",
                              hint=f"start it: opsctl migrate -f {args.file} --from SOURCE_SPEC")
    except OpsctlError as exc:
        if "no migration" in exc.summary:
            raise
    (state_dir / RESULT).unlink(missing_ok=True)
    write_private(state_dir / REQUEST, f"{time.time()}\n")
    deadline = time.monotonic() + CUTOVER_WAIT
    while time.monotonic() < deadline:
        text = read_bounded(state_dir / RESULT, "it is the running migration's report")
        if text is not None:
            print(text)
            return EXIT_OK if text.startswith("cutover done") else EXIT_ERROR
        time.sleep(0.05)
    print("the running migration did not report within 120s; its own output shows why", file=sys.stderr)
    return EXIT_ERROR


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("migrate", help="move a running topology into the topology SPEC describes, live, then cut over")
    p.add_argument("action", nargs="?", choices=("cutover",),
                   help="cutover: ask the running migration into SPEC to fence the source and cut over")
    add_spec_file(p, about="the target's topology spec (YAML)")
    p.add_argument("--from", dest="from_spec", metavar="SOURCE_SPEC", help="the spec of the running source")
    p.add_argument("--cutover", choices=("auto", "manual"), default="manual",
                   help="auto: cut over once every shard trails by less than --lag-bound; manual (default): "
                        "when `opsctl migrate cutover -f SPEC` asks")
    p.add_argument("--lag-bound", type=ranged(float, 0.01, 60.0), default=1.0,
                   help="seconds of lag under which --cutover auto starts the cutover (default 1)")
    p.add_argument("--sample", type=ranged(int, 1, 1_000_000), default=200,
                   help="random keys compared between source and target at the cutover (default 200)")
    add_auto_approve(p, "do not ask")
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.set_defaults(handler=recorded("migrate", cmd_migrate))
