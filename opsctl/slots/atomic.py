"""Server-side (atomic) slot migration: Valkey >= 9.0 CLUSTER MIGRATESLOTS, Redis >= 8.4 CLUSTER MIGRATION.

The server moves whole ranges itself and flips ownership atomically, so no slot is ever left open; opsctl
starts the job, polls its state (poll_interval), and cancels it on interrupt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from opsctl.base import stop
from opsctl.base.errors import ConvergenceError, OpsctlError
from opsctl.base.poll import Pending, wait_for
from opsctl.observe.replies import as_text, parse_pairs, server_of
from opsctl.slots.journal import Journal
from opsctl.slots.progress import Progress
from opsctl.slots.ranges import Ranges, count, text, to_ranges
from opsctl.slots.session import Peer, checked, pipe

DONE = frozenset({"success", "completed"})
FAILED = frozenset({"failed", "cancelled", "canceled"})
JOB_TIMEOUT = 3600.0
CANCEL_TIMEOUT = 30.0


def parse_migrations(reply: Sequence[Any]) -> list[dict[str, str]]:
    """CLUSTER GETSLOTMIGRATIONS / CLUSTER MIGRATION STATUS: one dict per job. Pure."""
    out = []
    for entry in reply or ():
        if isinstance(entry, Mapping):
            out.append({as_text(k): as_text(v) for k, v in entry.items()})
        else:
            out.append(parse_pairs([as_text(x) for x in entry]))
    return out


def job_state(jobs: Sequence[Mapping[str, str]], known: set[str]) -> str | None:
    """The state of the job(s) not in `known`: 'done', 'failed: <message>', or None while running. Pure."""
    mine = [j for j in jobs if job_id(j) not in known and j.get("operation", "EXPORT").upper() != "IMPORT"]
    if not mine:
        return None
    states = [j.get("state", "").lower() for j in mine]
    failed = [j for j, s in zip(mine, states, strict=True) if s in FAILED]
    if failed:
        return f"failed: {failed[0].get('state')} {failed[0].get('message', '')}".strip()
    return "done" if all(s in DONE for s in states) else None


def job_id(job: Mapping[str, str]) -> str:
    return job.get("name") or job.get("id") or job.get("task_id") or ""


def start_commands(flavor: str, target_id: str, ranges: Ranges) -> tuple[tuple[Any, ...], str]:
    """(command, which side runs it): Valkey exports from the source, Redis imports on the target. Pure."""
    flat = [x for r in ranges for x in r]
    if flavor == "valkey":
        return ("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", *flat, "NODE", target_id), "source"
    return ("CLUSTER", "MIGRATION", "IMPORT", *flat), "target"


def status_command(flavor: str) -> tuple[Any, ...]:
    return ("CLUSTER", "GETSLOTMIGRATIONS") if flavor == "valkey" else ("CLUSTER", "MIGRATION", "STATUS", "ALL")


def cancel_command(flavor: str) -> tuple[Any, ...]:
    return ("CLUSTER", "CANCELSLOTMIGRATIONS") if flavor == "valkey" else ("CLUSTER", "MIGRATION", "CANCEL", "ALL")


def atomic_move(source: Peer, target: Peer, slots: Sequence[int], journal: Journal, progress: Progress,
                info: Mapping[str, str], est_keys: int = 0) -> None:
    """Start one server-side job for all the slots and wait for it; cancel it if we are interrupted."""
    version = server_of(dict(info))
    flavor = version[0] if version else "valkey"
    ranges = to_ranges(slots)
    command, side = start_commands(flavor, target.id, ranges)
    runner = source if side == "source" else target
    status = status_command(flavor)
    known = {job_id(j) for j in parse_migrations(checked(runner, [status], "slot migration status")[0])}
    journal.opened(source.name, source.id, target.name, target.id, slots, mode="atomic")
    checked(runner, [command], "atomic slot migration")
    try:
        result = _wait_job(runner, status, known, f"the slot migration {source.name} -> {target.name} to finish")
    except stop.Stopped as exc:  # undo the step in flight: the server cancels, the slots stay with the source
        pipe(runner, [cancel_command(flavor)])
        wait_idle(runner, flavor, CANCEL_TIMEOUT)
        journal.closed(slots)
        raise stop.Stopped(exc.signum, f"the server-side move of slots {text(ranges)} {source.name} -> "
                           f"{target.name} was cancelled: the slots it had not handed over stay with the source",
                           exc.hint) from None
    except BaseException:
        pipe(runner, [cancel_command(flavor)])
        raise
    journal.closed(slots)
    if result != "done":
        raise OpsctlError(f"the server refused or failed the slot migration {source.name} -> {target.name}",
                          result, "the slots stay with the source; look at both nodes' logs, then retry")
    progress.add(slots=count(ranges), keys=est_keys)


def poll_interval(elapsed: float, first: float = 0.002, most: float = 0.01) -> float:
    """Seconds until the next look at a job running for `elapsed` seconds: `first`, then a fiftieth of the time
    taken so far, at most `most`, so a job is seen done at most `most` (or a fiftieth of its time) late. Pure.
    Why: a whole reshard can take about a second, and a look is one short round trip."""
    return min(most, max(first, elapsed / 50))


def _wait_job(runner: Peer, status: tuple[Any, ...], known: set[str], what: str) -> str:
    """The job's end state; each look is a safe point for a stop request (opsctl.base.stop)."""
    started = time.monotonic()

    def state() -> str | None:
        stop.check()
        return job_state(parse_migrations(checked(runner, [status], "slot migration status")[0]), known)

    return wait_for(state,
                    JOB_TIMEOUT, what, lambda: poll_interval(time.monotonic() - started),
                    on_timeout=lambda _: ConvergenceError(
                        f"timed out after {JOB_TIMEOUT:g}s waiting for {what}", "still moving",
                        "look at both nodes' logs; `opsctl cluster fix -f SPEC` once it ended"))


def wait_idle(peer: Peer, flavor: str, timeout: float = JOB_TIMEOUT) -> None:
    """Wait until the node runs no migration job (used when resuming after a killed run)."""
    def idle() -> bool | Pending:
        jobs = parse_migrations(checked(peer, [status_command(flavor)], "slot migration status")[0])
        busy = [j for j in jobs if j.get("state", "").lower() not in DONE | FAILED]
        return Pending(f"{len(busy)} job(s) running") if busy else True

    wait_for(idle, timeout, f"slot migrations on {peer.name} to finish")
