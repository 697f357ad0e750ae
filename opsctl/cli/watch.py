"""`opsctl status --watch`: the status table redrawn in place every few seconds, for the on-call engineer who has
no Grafana at hand. One look per refresh, no lock taken (status changes nothing); Ctrl-C ends it."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TextIO

from opsctl.base import stop
from opsctl.base.errors import EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:
    from opsctl.runtime.opening import Runtime
    from opsctl.status.looks import StatusResult

HOME_AND_CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen: the next frame replaces this one


def frame(status: StatusResult, interval: float, now: datetime) -> str:
    """One refresh as text: when and how often, the table with OPS/S, the health line (and its hint), a standby's
    link. Pure."""
    from opsctl.status.looks import status_table

    head = f"opsctl status '{status.spec}' every {interval:g}s, {now:%Y-%m-%d %H:%M:%S}Z (Ctrl-C to stop)"
    lines = [head, "", status_table(list(status.nodes), with_ops=True), status.health]
    lines += [f"  hint: {status.hint}"] if status.hint else []
    lines += [status.standby.line()] if status.standby else []
    return "\n".join(lines)


def watch_status(rt: Runtime, output: str, interval: float, stream: TextIO = sys.stdout) -> int:
    """Refresh until Ctrl-C (or SIGTERM): on a terminal each frame replaces the last; piped, frames follow one
    another; as JSON, one envelope per line. Exit as status does for the last look: 0 healthy, 1 not."""
    from opsctl.cli.output import envelope
    from opsctl.status import watch

    healthy = True
    on_tty = stream.isatty()
    try:
        for status in watch(rt, interval):
            healthy = status.healthy
            if output == "json":
                stream.write(json.dumps(envelope(status.to_dict()), default=str) + "\n")
            else:
                text = frame(status, interval, datetime.now(timezone.utc))
                stream.write(HOME_AND_CLEAR + text + "\n" if on_tty else text + "\n\n")
            stream.flush()
    except stop.Stopped:
        pass  # the way a watch ends, not a failure
    return EXIT_OK if healthy else EXIT_ERROR
