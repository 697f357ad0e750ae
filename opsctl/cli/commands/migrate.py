"""`opsctl migrate -f TARGET_SPEC --from SOURCE_SPEC` (live migration) and `opsctl migrate cutover -f TARGET_SPEC`
(asks the running migration to cut over, from another terminal, and prints its report)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.options import (
    STATE_DIR_TUNNELS_HELP,
    add_auto_approve,
    add_force_lock,
    add_output,
    add_spec_file,
    add_state_dir,
    ranged,
)
from opsctl.cli.runsignals import note_run, recorded

CUTOVER_WAIT = 120.0

if TYPE_CHECKING:
    from opsctl.base.events import Emit
    from opsctl.migrate.foreign import ForeignSource
    from opsctl.net.connector import Connector


ENDPOINT_OPTIONS = ("from_password_file", "from_password_env", "from_user", "from_tls_ca", "from_tls_cert",
                    "from_tls_key")


MIGRATING = {"lag_bound": 1.0, "sample": 200}  # defaults of options that go with `opsctl migrate` only


def check_mode(args: argparse.Namespace) -> None:
    """Options of the other mode refused, not ignored, before anything is read; the defaults filled in."""
    from opsctl.cli.options import fill_defaults, refuse_given

    if args.action == "cutover":
        refuse_given(args, ("from_spec", "from_endpoints", *ENDPOINT_OPTIONS, *MIGRATING), "`opsctl migrate`, "
                     "not with `migrate cutover` (the running migration has its source and settings)",
                     "opsctl migrate cutover -f TARGET_SPEC [--lift-fence]")
    else:
        refuse_given(args, ("lift_fence",), "`opsctl migrate cutover`", "drop --lift-fence")
        if args.cutover != "auto":
            refuse_given(args, ("lag_bound",), "--cutover auto", "add --cutover auto, or drop --lag-bound")
    fill_defaults(args, MIGRATING)


def cmd_migrate(args: argparse.Namespace) -> int:
    check_mode(args)
    if args.action == "cutover":
        return _request_cutover(args)
    from opsctl.cli.options import confirm
    from opsctl.state.specfile import read_spec

    if bool(args.from_spec) == bool(args.from_endpoints):
        raise OpsctlError("opsctl migrate needs one source: --from SOURCE_SPEC or --from-endpoints HOST:PORT[,...]",
                          hint="opsctl migrate -f TARGET --from SOURCE, or -f TARGET --from-endpoints HOST:PORT "
                               "--from-password-file PATH")
    stray = [f"--{name.replace('_', '-')}" for name in ENDPOINT_OPTIONS if getattr(args, name)]
    if args.from_spec and stray:
        raise OpsctlError(f"{', '.join(stray)} go with --from-endpoints, not --from",
                          hint="a source spec names its own password and TLS files; drop the option")
    if args.from_endpoints:  # endpoints, password, TLS files: checked before any spec, lock or connection
        from opsctl.migrate.foreign import check_source

        check_source(_foreign(args))
    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    if loaded.spec.follows is not None:  # its clients' users are fenced; only the follower writes into it
        raise OpsctlError(f"'{loaded.spec.name}' is a standby (its spec says follows:): it is filled by `opsctl "
                          "follow`, not by a migration", hint=f"opsctl follow -f {args.file}, or remove follows: "
                          "from the spec to migrate into it")
    shown = f"'{read_spec(args.from_spec).spec.name}'" if args.from_spec else args.from_endpoints
    confirm(args, f"Migrate {shown} into '{loaded.spec.name}' (the target must be empty)?")
    return _migrate(args)


def _migrate(args: argparse.Namespace) -> int:
    """The migration from the source args names into the target spec, in the foreground, until its cutover."""
    from contextlib import ExitStack

    from opsctl.base import stop
    from opsctl.base.events import Note
    from opsctl.cli.output import Printer
    from opsctl.migrate.migration import MigrateOptions, run_migrate
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    state_dir = state_dir_for(loaded, args.state_dir)
    options = MigrateOptions(args.cutover, args.lag_bound, args.sample)
    with ExitStack() as stack:
        stack.enter_context(state_lock(state_dir))
        source_connector, ref = _source(args, state_dir, stack)
        target_connector = stack.enter_context(open_connector(loaded, state_dir))
        json_mode = args.output == "json"
        stack.enter_context(topology_lock(target_connector, force=args.force_lock, emit=Printer(json_mode)))
        emit = emitter(stack, json_mode)
        try:
            report = run_migrate(source_connector, target_connector, state_dir, options, emit, ref)
        except stop.Stopped as stopped:
            if not stop.asked_once():
                raise
            # a pause, said as a closing line, not an error; still 143/130: exit 0 means cut over
            emit(Note(f"the migration stopped on {signal.Signals(stopped.signum).name} before its cutover: it is "
                      f"journaled, run the same command to go on (`opsctl migrate cutover -f {args.file}` "
                      "finishes a cutover that had begun)"))
            return stopped.exit_code
    if not json_mode:
        print(report.line())
    return EXIT_OK if report.ok else EXIT_ERROR


def emitter(stack: ExitStack, json_mode: bool) -> Emit:
    """The migration's events, entered on stack: JSON lines on stdout (the cutover report the last), or text on
    stderr without the report, which goes to stdout at the end."""
    from opsctl.base.events import Event
    from opsctl.cli.output import printing
    from opsctl.migrate.cutover import CutoverDone

    printer = stack.enter_context(printing(json_mode, sys.stdout if json_mode else sys.stderr, (CutoverDone,)))

    def emit(event: Event) -> None:
        if json_mode or not isinstance(event, CutoverDone):
            printer(event)
    return emit


def _source(args: argparse.Namespace, state_dir: Path, stack: ExitStack) -> tuple[Connector, dict[str, str]]:
    """The source's connector and the options that reach it again. A spec's topology lock is held (no opsctl run
    reshards it meanwhile); a store given by endpoints has none."""
    from opsctl.cli.output import Printer
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    if args.from_endpoints:
        from opsctl.migrate.foreign import foreign_connector

        foreign = _foreign(args)
        return foreign_connector(foreign), foreign.ref()
    source = read_spec(args.from_spec)
    connector = stack.enter_context(open_connector(source, state_dir_for(source, None)))
    stack.enter_context(topology_lock(connector, force=args.force_lock, emit=Printer(args.output == "json")))
    return connector, {} if args.from_spec == "-" else {"from_spec": os.path.abspath(args.from_spec)}


def _foreign(args: argparse.Namespace) -> ForeignSource:
    from opsctl.migrate.foreign import ForeignSource, parse_endpoints

    return ForeignSource(parse_endpoints(args.from_endpoints), args.from_password_file, args.from_password_env,
                         args.from_user, args.from_tls_ca, args.from_tls_cert, args.from_tls_key)


def running(state_dir: Path) -> bool:
    """Whether a migrate into this target runs now (it holds the target's state lock)."""
    from opsctl.state.statelock import state_lock

    try:
        with state_lock(state_dir):
            return False
    except OpsctlError:
        return True


def _request_cutover(args: argparse.Namespace) -> int:
    """Leave the request file for the running migration, then wait for its report file. With no migration running
    but a cutover interrupted (the journal keeps the fence it set): finish it, or with --lift-fence lift it."""
    from opsctl.migrate.phases import read_journal
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    state_dir = state_dir_for(loaded, args.state_dir)
    if not running(state_dir):
        journal = read_journal(state_dir)
        if journal is not None and not journal.finished and journal.fence is not None:
            return _interrupted(args, journal.source_ref)
        raise OpsctlError(f"no migration into '{loaded.spec.name}' is running",
                          hint=f"start it: opsctl migrate -f {args.file} --from SOURCE_SPEC")
    if args.lift_fence:
        raise OpsctlError("a migration is running: --lift-fence is for a cutover that was interrupted",
                          hint="stop the migration first (Ctrl-C), or let it cut over")
    again = f"run `opsctl migrate cutover -f {args.file}` again: it finishes an interrupted cutover (or " \
            "`--lift-fence` lifts the source's fence)"
    return ask_cutover(state_dir, again, json_mode=args.output == "json")


def ask_cutover(state_dir: Path, again: str, take: bool = False, json_mode: bool = False) -> int:
    """Leave the request file for the migration running into state_dir, wait for its report and print it; again:
    the hint when it stopped before it reported. Also `opsctl switchover`'s (a standby's link is a migration), which
    takes the report (removes the file): a link whose switchover failed follows on once it is taken."""
    from opsctl.cli.output import say
    from opsctl.migrate.phases import REQUEST, RESULT
    from opsctl.state.safefs import read_bounded, write_private

    (state_dir / RESULT).unlink(missing_ok=True)
    write_private(state_dir / REQUEST, f"{time.time()}\n")
    deadline, looked = time.monotonic() + CUTOVER_WAIT, time.monotonic()
    while time.monotonic() < deadline:
        text = read_bounded(state_dir / RESULT, "it is the running migration's report")
        if text is not None:
            if take:
                (state_dir / RESULT).unlink(missing_ok=True)
            print(text)
            return EXIT_OK if text.startswith("cutover done") else EXIT_ERROR
        if time.monotonic() - looked > 0.5:
            looked = time.monotonic()
            if not running(state_dir) and read_bounded(state_dir / RESULT, "the report") is None:
                (state_dir / REQUEST).unlink(missing_ok=True)
                raise OpsctlError("the migration stopped before it reported on the cutover", hint=again)
        time.sleep(0.05)
    say("the running migration did not report within 120s; its own output shows why", json_mode)
    return EXIT_ERROR


def _interrupted(args: argparse.Namespace, ref: dict[str, str]) -> int:
    """A cutover killed mid-way left the source fenced: resume the migration and cut over at once (the source
    takes no writes, so its last offset is known), or lift the fence."""
    if not ref:
        raise OpsctlError("a cutover was interrupted and the source is fenced, but the journal does not say how to "
                          "reach the source (its spec came on standard input)",
                          hint="run the same `opsctl migrate -f TARGET --from SOURCE_SPEC` again: it cuts over")
    resumed = argparse.Namespace(**{**vars(args), "from_spec": None, "from_endpoints": None,
                                    **dict.fromkeys(ENDPOINT_OPTIONS), **ref})
    if args.lift_fence:
        return _lift(resumed)
    from opsctl.cli.output import say

    say("a cutover was interrupted (the source is fenced): resuming the migration to finish it", args.output == "json")
    return _migrate(resumed)


def _lift(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from opsctl.migrate.cutover import lift_fence
    from opsctl.migrate.phases import JournalFile, read_journal
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    state_dir = state_dir_for(loaded, args.state_dir)
    with ExitStack() as stack:
        stack.enter_context(state_lock(state_dir))
        journal = read_journal(state_dir)
        assert journal is not None
        source, _ = _source(args, state_dir, stack)
        lifted = lift_fence(source, JournalFile(state_dir, journal))
    print(f"fence lifted on {', '.join(lifted) or 'no master'}: the source serves writes again; the target is as "
          f"the interrupted cutover left it (re-run `opsctl migrate` to resume, or empty it)")
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("migrate", help="move a running topology into the topology SPEC describes, live, then cut over")
    p.add_argument("action", nargs="?", choices=("cutover",),
                   help="cutover: ask the running migration into SPEC to fence the source and cut over")
    add_spec_file(p, about="the target's topology spec (YAML)")
    p.add_argument("--from", dest="from_spec", metavar="SOURCE_SPEC", help="the spec of the running source")
    p.add_argument("--from-endpoints", metavar="HOST:PORT[,HOST:PORT]", help=(
        "instead of --from: a source opsctl did not deploy, by one or more of its servers' endpoints (a cluster's "
        "members are found with CLUSTER NODES, a master's replicas with INFO replication)"))
    p.add_argument("--from-password-file", metavar="PATH", help=(
        "with --from-endpoints: a file holding only the source's password (mode 0600)"))
    p.add_argument("--from-password-env", metavar="VAR", help=(
        "with --from-endpoints: the environment variable holding the source's password"))
    p.add_argument("--from-user", metavar="NAME", help="with --from-endpoints: the source's ACL user (default: none)")
    p.add_argument("--from-tls-ca", metavar="PATH", help=(
        "with --from-endpoints: the source speaks TLS; the CA bundle its certificates chain to"))
    p.add_argument("--from-tls-cert", metavar="PATH", help=(
        "with --from-tls-ca: opsctl's client certificate, for a source that asks for one (tls-auth-clients)"))
    p.add_argument("--from-tls-key", metavar="PATH", help="with --from-tls-cert: its private key's file")
    p.add_argument("--lift-fence", action="store_true", help=(
        "cutover: a cutover that was interrupted left the source fenced; lift the fence instead of finishing it"))
    p.add_argument("--cutover", choices=("auto", "manual"), default="manual",
                   help="auto: cut over once every shard trails by less than --lag-bound; manual (default): "
                        "when `opsctl migrate cutover -f SPEC` asks")
    p.add_argument("--lag-bound", type=ranged(float, 0.01, 60.0),
                   help="seconds of lag under which --cutover auto starts the cutover (default 1)")
    p.add_argument("--sample", type=ranged(int, 1, 1_000_000),
                   help="random keys compared between source and target at the cutover (default 200)")
    add_auto_approve(p, "do not ask")
    add_force_lock(p)
    add_state_dir(p, STATE_DIR_TUNNELS_HELP)
    add_output(p)
    p.set_defaults(handler=recorded("migrate", cmd_migrate))
