"""--metrics-textfile DIR: a command's handler wrapped so that its run, success or failure, ends with its textfile
(docs/monitoring.md, "The metrics opsctl writes"). The handler notes the topology once it read the spec and the keys
it moved; a run that never read its spec has no topology to name and writes nothing."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # every command's parser imports this module: --help must stay light (tests/test_cli_start.py)
    from opsctl.base.events import Emit, Event

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


class LinkTextfile:
    """follow --metrics-textfile DIR: the standby link's lag (DIR/opsctl_<standby>_follow.prom) refreshed each
    EVERY seconds while it runs, following 0 once it stopped, removed after a switchover (the standby follows
    nothing then: no alert may read it). Called as the link's emit; a failed write is a warning (once per cause),
    never the link's error: a full disk must not stop a standby."""

    EVERY = 1.0  # the link reports its lag twice a second; node_exporter reads the file at each scrape

    def __init__(self, folder: str, standby: str, emit: Emit, json_mode: bool) -> None:
        check_folder(folder)
        self.folder, self.standby, self.emit, self.json_mode = folder, standby, emit, json_mode
        self.shards: Mapping[str, Mapping[str, object]] = {}
        self.written, self.warned = 0.0, ""

    def __call__(self, event: Event) -> None:
        from opsctl.migrate.migration import MigrateLag
        from opsctl.standby.link import PrimaryAwaited

        self.emit(event)
        if isinstance(event, MigrateLag):
            self.shards = event.shards
        elif isinstance(event, PrimaryAwaited):  # the link stopped: no shard streams, and no lag report comes
            self.shards = {key: {**{k: v for k, v in row.items() if k not in ("lag_bytes", "lag_seconds")},
                                 "phase": "attach"} for key, row in self.shards.items()}
        else:
            return
        if time.monotonic() - self.written >= self.EVERY:
            self.written = time.monotonic()
            self._write(following=True)

    def stopped(self, switched: bool) -> None:
        """The link ended: switched over (the file goes), else following 0 with its last lag."""
        if not switched:
            self._write(following=False)
            return
        from pathlib import Path

        from opsctl.metrics.signals import FOLLOW_COMMAND, textfile_name

        (Path(self.folder) / textfile_name(self.standby, FOLLOW_COMMAND)).unlink(missing_ok=True)

    def _write(self, following: bool) -> None:
        from pathlib import Path

        from opsctl.base.errors import OpsctlError
        from opsctl.metrics.signals import write_follow_textfile

        try:
            write_follow_textfile(Path(self.folder), self.standby, self.shards, following)
        except (OpsctlError, OSError) as exc:
            if str(exc) != self.warned:
                self.warned = str(exc)
                from opsctl.cli.output import say

                say(f"warning: --metrics-textfile: {exc} (the link goes on)", self.json_mode)
