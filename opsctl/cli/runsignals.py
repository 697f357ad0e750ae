"""--metrics-textfile DIR: a command's handler wrapped so that its run, success or failure, ends with its textfile
(docs/monitoring.md, "The metrics opsctl writes"). The handler notes the topology once it read the spec and the keys
it moved; a run that never read its spec has no topology to name and writes nothing."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]
_TOPOLOGY, _KEYS = "_run_topology", "_run_keys"


def note_run(args: argparse.Namespace, topology: str | None = None, keys: int | None = None) -> None:
    """What the textfile names: the spec's topology, and the keys the run moved, saved or restored."""
    if topology is not None:
        setattr(args, _TOPOLOGY, topology)
    if keys is not None:
        setattr(args, _KEYS, keys)


def recorded(command: str, handler: Handler) -> Handler:
    """handler, writing command's textfile at the end when --metrics-textfile is given; the folder is checked before
    the run, so a wrong one changes nothing."""

    def run(args: argparse.Namespace) -> int:
        folder = getattr(args, "metrics_textfile", None)
        if folder is not None:  # a dry run's too: a wrong folder is said whatever the mode
            check_folder(folder)
        if folder is None or getattr(args, "dry_run", False):  # a dry run is no run: it leaves no signal
            return handler(args)
        started, code, failing = time.monotonic(), 1, True
        try:
            code = handler(args)
            failing = False
            return code
        except BaseException as exc:
            code = getattr(exc, "exit_code", 130 if isinstance(exc, KeyboardInterrupt) else 1)
            raise
        finally:
            _write(args, folder, command, time.monotonic() - started, code, failing)

    return run


def check_folder(folder: str) -> None:
    """Before the run: a folder, not a link, this user may write (a run that worked must not end in an error)."""
    from opsctl.metrics.signals import HINT
    from opsctl.state.safefs import check_writable_folder

    check_writable_folder(folder, HINT)


def _write(args: argparse.Namespace, folder: str, command: str, duration: float, code: int, failing: bool) -> None:
    """Write the textfile; while the run itself fails, a failed write is a line on stderr, never the run's error."""
    topology = getattr(args, _TOPOLOGY, None)
    if topology is None:
        return
    from pathlib import Path

    from opsctl.base.errors import OpsctlError
    from opsctl.metrics.signals import RunSignal, outcome_of, write_textfile

    run = RunSignal(command=command, topology=topology, finished=time.time(), duration=duration,
                    outcome=outcome_of(code), keys_moved=getattr(args, _KEYS, None))
    try:
        write_textfile(Path(folder), run)
    except (OpsctlError, OSError) as exc:
        if not failing:
            raise
        from opsctl.cli.output import say

        say(f"warning: --metrics-textfile: {exc}", getattr(args, "output", None) == "json")
