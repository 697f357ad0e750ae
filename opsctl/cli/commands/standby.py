"""`opsctl follow -f STANDBY` (the standby's link, in the foreground, until a switchover) and `opsctl switchover -f
STANDBY` (asks the running link to switch over, and prints its report). docs/standby.md."""

from __future__ import annotations

import argparse
import signal
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.options import (
    add_auto_approve,
    add_force_lock,
    add_output,
    add_spec_file,
    add_state_dir,
    ranged,
)
from opsctl.cli.runsignals import LinkTextfile, check_folder, note_run, recorded

if TYPE_CHECKING:
    from opsctl.spec.load import LoadedSpec


def cmd_follow(args: argparse.Namespace) -> int:
    from opsctl.base import stop
    from opsctl.base.events import Note
    from opsctl.cli.commands.migrate import emitter
    from opsctl.cli.options import confirm
    from opsctl.standby.link import run_follow
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.standbyfiles import read_switched

    folder = getattr(args, "follow_textfile", None)  # switchover finishing an interrupted one has none
    if folder is not None:
        check_folder(folder)  # before anything: a wrong folder changes nothing
    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    json_mode = args.output == "json"
    with ExitStack() as stack:
        emit = emitter(stack, json_mode)
        textfile = None if folder is None else LinkTextfile(folder, loaded.spec.name, emit, json_mode)
        # switched over already (a service restarted after the switchover, or after --primary-lost): the link is
        # refused, and its textfile goes, so that no alert says a promoted standby does not follow
        switched = read_switched(state_dir) is not None
        try:
            report = run_follow(loaded, state_dir, textfile or emit, args.sample, args.force_lock,
                                approve=lambda question: confirm(args, question))
            switched = report.ok
        except stop.Stopped as stopped:
            if not stop.asked_once():
                raise
            emit(Note(f"the link stopped on {signal.Signals(stopped.signum).name}: it is journaled, run the same "
                      "command to go on (the standby keeps refusing client writes)"))
            return stopped.exit_code
        finally:
            if textfile is not None:
                textfile.stopped(switched)
    if not json_mode:
        print(report.line())
    return EXIT_OK if report.ok else EXIT_ERROR


def cmd_switchover(args: argparse.Namespace) -> int:
    from opsctl.cli.commands.migrate import ask_cutover, running
    from opsctl.cli.options import confirm
    from opsctl.cli.output import say
    from opsctl.migrate.phases import read_journal
    from opsctl.standby.link import refuse_switched
    from opsctl.standby.primary import primary_of
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.standbyfiles import read_switched

    loaded = read_spec(args.file)
    note_run(args, loaded.spec.name)
    state_dir = state_dir_for(loaded, args.state_dir)
    name = loaded.spec.name
    if not args.primary_lost and read_switched(state_dir) is not None:
        return _finish_switch(loaded, state_dir)
    refuse_switched(loaded, state_dir)
    primary = primary_of(loaded)
    if args.primary_lost:
        return _primary_lost(args, state_dir, running(state_dir))
    if args.force_lock:  # the running link holds the standby's lock: only --primary-lost takes it
        raise OpsctlError("--force-lock goes with --primary-lost", hint="drop --force-lock")
    if not running(state_dir):
        journal = read_journal(state_dir)
        if journal is not None and not journal.finished and journal.fence is not None:
            say("a switchover was interrupted (the primary is fenced): finishing it", args.output == "json")
            return cmd_follow(argparse.Namespace(**{**vars(args), "sample": 200, "auto_approve": True}))
        raise OpsctlError(f"no `opsctl follow` runs for '{name}': a planned switchover is its last step",
                          hint=f"start it (it resumes from its journal): opsctl follow -f {args.file}; then switch "
                               "over")
    confirm(args, f"Switch over: fence {primary.shown} against writes and let '{name}' take them?")
    again = f"run `opsctl switchover -f {args.file}` again: it finishes the interrupted switchover (the primary " \
            "refuses writes meanwhile)"
    if args.output != "json":
        return ask_cutover(state_dir, again, take=True)
    import io
    import json
    from contextlib import redirect_stdout

    report = io.StringIO()
    with redirect_stdout(report):
        code = ask_cutover(state_dir, again, take=True)
    print(json.dumps({"event": "switchover", "ok": code == EXIT_OK, "report": report.getvalue().strip()}))
    return code


def _finish_switch(loaded: LoadedSpec, state_dir: Path) -> int:
    from opsctl.standby.link import finish_switch

    missed = finish_switch(loaded, state_dir)
    print(f"'{loaded.spec.name}' was switched over; its fence is lifted on every server"
          + (f" but {', '.join(missed)}" if missed else "") + f" (remove follows: from {loaded.file} and apply it)")
    return EXIT_ERROR if missed else EXIT_OK


def _primary_lost(args: argparse.Namespace, state_dir: Path, following: bool) -> int:
    from opsctl.cli.options import confirm
    from opsctl.standby.takeover import take_over
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    if following:
        raise OpsctlError(f"`opsctl follow` still runs for '{loaded.spec.name}'",
                          hint="stop it first (Ctrl-C, or stop its service): a link to a lost primary only waits")
    confirm(args, f"Switch over with the primary lost: '{loaded.spec.name}' takes writes with what it holds, and "
                  "writes the primary took after the link's last read are not on it. Go on?")
    result = take_over(loaded, state_dir, args.force_lock)
    if args.output == "json":
        import json

        print(json.dumps({"event": "switchover", "ok": True, "mode": "primary-lost", "recovery": result.recovery,
                          "point_to": result.point_to, "missed": result.missed, "report": result.line()}))
    else:
        print(result.line())
    return EXIT_OK


def register_follow(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("follow", help="run a standby's link: copy, then stream its primary's writes into it, until "
                                      "a switchover")
    add_spec_file(p, about="the standby's topology spec (YAML), with follows:")
    p.add_argument("--sample", type=ranged(int, 1, 1_000_000), default=200,
                   help="random keys compared between primary and standby at the switchover (default 200)")
    add_auto_approve(p, "a standby that holds keys before its first copy is emptied without asking")
    # its own dest: recorded() would write its run signal at the end into the same file name
    p.add_argument("--metrics-textfile", metavar="DIR", dest="follow_textfile",
                   help="keep DIR/opsctl_<standby>_follow.prom current (each second) for node_exporter's textfile "
                        "collector: the lag per source shard and whether the link runs (the folder must exist)")
    add_force_lock(p)
    add_state_dir(p)
    add_output(p)
    p.set_defaults(handler=recorded("follow", cmd_follow))


def register_switchover(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("switchover", help="make a standby the primary: fence the primary, let the standby catch up, "
                                          "verify, lift the standby's fence")
    add_spec_file(p, about="the standby's topology spec (YAML), with follows:")
    p.add_argument("--primary-lost", action="store_true", help=(
        "the primary's site is gone: no fence, no catching up; the standby takes writes with what it holds, and the "
        "recovery point (per source shard, the offset and time the link last read) is reported"))
    add_auto_approve(p, "do not ask")
    add_force_lock(p)
    add_state_dir(p)
    add_output(p)
    p.set_defaults(handler=recorded("switchover", cmd_switchover))


