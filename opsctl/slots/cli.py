"""The slot subcommands' glue: event printers (JSON lines or a terminal progress bar) and result text."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from opsctl.slots.progress import CLEAR_LINE, TtyLine, bar_line, human_bytes
from opsctl.slots.run import Outcome

Event = dict[str, Any]


def printer(json_mode: bool, stream: TextIO | None = None) -> Callable[[Event], None]:
    """JSON lines on stderr with --output json; on a terminal a bar redrawn in place (cut to the terminal's
    width, cleared before any other message); else one line per event kind and no control characters."""
    out = stream or sys.stderr
    line = TtyLine(out) if out.isatty() else None

    def say(text: str) -> None:
        if line:
            out.write(CLEAR_LINE)
        print(text, file=out, flush=True)

    def emit(event: Event) -> None:
        kind = event.get("event")
        if json_mode:
            print(json.dumps(event, default=str), file=out, flush=True)
        elif kind == "slots-progress":
            if line:
                line.show(bar_line(event), force=True)
        elif kind == "slots-done":
            if line:
                line.done(bar_line(event))
            else:
                print(bar_line(event), file=out, flush=True)
        elif kind == "slots-start":
            say(f"moving {sum(m['slot_count'] for m in event['moves'])} slots ({event['mode']})")
        elif kind in ("big-key", "busy-key-equal", "migrate-retry", "closed"):
            say(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in event.items() if k != "event"))

    return emit


def outcome_text(outcome: Outcome) -> str:
    lines = [("Would move" if outcome.dry_run else "Moves") + f": {len(outcome.moves)}"]
    for m in outcome.moves:
        lines.append(f"  {m['source']} -> {m['target']}: {m['slot_count']} slots ({m['slots']}), "
                     f"~{m['est_keys']} keys, ~{human_bytes(m['est_bytes'])}")
    lines += [f"  {note}" for note in outcome.notes]
    s = outcome.summary
    if s:
        lines.append(f"moved {s['slots_done']} slots, {s['keys']} keys in {s['seconds']:.2f}s "
                     f"({s['keys_per_sec']:.0f} keys/s, {s['mode']})")
    return "\n".join(lines)


def outcome_json(outcome: Outcome) -> str:
    return json.dumps({"dry_run": outcome.dry_run, "moves": outcome.moves, "summary": outcome.summary,
                       "notes": outcome.notes}, indent=2)
