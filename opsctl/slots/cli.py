"""The slot subcommands' result text (their events print through opsctl.cli.output.Printer)."""

from __future__ import annotations

from opsctl.base.words import human_bytes
from opsctl.slots.session import Outcome


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

