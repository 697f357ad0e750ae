"""A staged rollout: `--waves 1,25%,100%` read (each a count or a share of the fleet, cumulative, growing) and
the fleet applied wave by wave (each wave's topologies at most `parallel` at once), a health
gate after each (converged and healthy, and for gate_seconds no failover: every look healthy with the same masters),
halting at the first topology or gate that fails; the journal lets the same command finish a killed run."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl.apply.planning import spec_digest
from opsctl.apply.rounds import DEFAULTS, ApplyOptions, ApplyResult, apply
from opsctl.base.errors import OpsctlError
from opsctl.base.events import plural
from opsctl.base.record import digest
from opsctl.fleet.rolloutlog import LOCK, Journal, read_journal, state_folder, write_journal
from opsctl.fleet.summary import PARALLEL, FleetResult, Outcome, run_each
from opsctl.runtime.opening import RuntimeOptions, open_runtime
from opsctl.spec.fleet import Fleet
from opsctl.spec.load import LoadedSpec
from opsctl.status.looks import StatusResult, status

GATE_LOOK = 1.0  # seconds between the gate's looks


HINT = "--waves takes cumulative sizes, each a count or a percentage, growing: e.g. 1,25%,100%"


def parse_waves(text: str) -> tuple[str, ...]:
    """The sizes of --waves, checked (a count >= 1, a percentage in 1..100)."""
    sizes = tuple(part.strip() for part in text.split(","))
    for size in sizes:
        number = size[:-1] if size.endswith("%") else size
        if not number.isdigit() or int(number) < 1 or (size.endswith("%") and int(number) > 100):
            raise OpsctlError(f"--waves {text}: {size!r} is not a count (1 or more) or a percentage (1%..100%)",
                              hint=HINT)
    return sizes


def cut_waves(names: Sequence[str], sizes: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """names in waves: each size is how many have been reached by the end of that wave (a share rounded up, at
    least one more than the wave before); what the last size leaves is a last wave of its own."""
    total = len(names)
    waves: list[tuple[str, ...]] = []
    reached = 0
    for size in sizes:
        target = math.ceil(total * int(size[:-1]) / 100) if size.endswith("%") else int(size)
        target = min(total, max(target, reached + 1))
        if target > reached:
            waves.append(tuple(names[reached:target]))
            reached = target
    if reached < total:
        waves.append(tuple(names[reached:]))
    return tuple(waves)


@dataclass(frozen=True)
class RolloutOptions:
    sizes: tuple[str, ...]
    gate_seconds: float = 30.0
    parallel: int = PARALLEL
    apply: ApplyOptions = DEFAULTS
    resume: bool = False


@dataclass(frozen=True)
class Applied:
    """One topology's apply, as a fleet shows it: its line, and as JSON its rounds' plans and closing status."""

    result: ApplyResult

    def text(self) -> str:
        status = self.result.status
        return f"{plural(self.result.steps_run, 'step')} run; {'no look' if status is None else status.health}"

    def to_dict(self) -> dict[str, object]:
        status = self.result.status
        return {"spec": self.result.spec, "steps_run": self.result.steps_run, "healthy": self.result.healthy,
                "rounds": [r.plan.to_dict() for r in self.result.rounds],
                "status": None if status is None else status.to_dict()}


def apply_all(fleet: Fleet, options: ApplyOptions, parallel: int = PARALLEL) -> FleetResult[Applied]:
    """Every topology applied, at most parallel at once; one that fails does not stop the others."""
    return FleetResult("apply", tuple(run_each(lambda loaded: apply_one(loaded, options), fleet.specs, parallel)))


@dataclass(frozen=True)
class RolloutResult:
    """applied: each topology applied by this run, in order; halted: what failed and why (None: all converged);
    untouched: the topologies of later waves, never started."""

    waves: tuple[tuple[str, ...], ...]
    applied: FleetResult[Applied]
    halted: str | None
    untouched: tuple[str, ...]
    note: str | None = None

    def text(self) -> str:
        lines = [f"note: {self.note}"] if self.note else []
        lines += [f"wave {i + 1}: {', '.join(w)}" for i, w in enumerate(self.waves)]
        lines += [self.applied.text()] if self.applied.outcomes else []
        if self.halted:
            lines.append(f"HALTED: {self.halted}")
            lines += [f"untouched: {', '.join(self.untouched)}"] if self.untouched else []
        else:
            lines.append("rollout done: every topology converged and passed its gate")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {**self.applied.to_dict(), "waves": [list(w) for w in self.waves], "halted": self.halted,
                "untouched": list(self.untouched), "note": self.note}


def rollout(fleet: Fleet, options: RolloutOptions) -> RolloutResult:
    """The rollout, one at a time per folder: a second one while it runs is refused naming the holder; the record
    of a run that was killed is taken over, said in the result."""
    from opsctl.state.statelock import named_lock

    # 0711: the folder holds each topology's state dir, which a local server's own user must pass through
    with named_lock(state_folder(Path(fleet.folder)), LOCK, "this folder's rollout", 0o711) as stale:
        done = _rollout(fleet, options)
    if stale is None:
        return done
    return replace(done, note=f"took over the rollout lock from {stale.text()}: that run is gone")


def _rollout(fleet: Fleet, options: RolloutOptions) -> RolloutResult:
    names = tuple(s.spec.name for s in fleet.specs)
    waves = cut_waves(names, options.sizes)
    key = digest([[list(w) for w in waves], [spec_digest(s) for s in fleet.specs]])
    journal = _journal(fleet, key, waves, options.resume)
    by_name = {s.spec.name: s for s in fleet.specs}
    outcomes: list[Outcome[Applied]] = []
    for index, wave in enumerate(waves):
        if index in journal.gated:
            continue
        journal = journal.starting(wave)
        write_journal(Path(fleet.folder), journal)
        done = run_each(lambda loaded: apply_one(loaded, options.apply), [by_name[n] for n in wave], options.parallel)
        outcomes += done
        for outcome in done:
            if not outcome.failed:
                journal = journal.finished(outcome.name)
        write_journal(Path(fleet.folder), journal)  # the wave applied: its gate next
        why = _wave_failure(done) or _gate([by_name[n] for n in wave], options.gate_seconds)
        if why is not None:
            journal = journal.halt(index, f"wave {index + 1}: {why}")
            write_journal(Path(fleet.folder), journal)
            later = tuple(n for w in waves[index + 1:] for n in w)
            return RolloutResult(waves, FleetResult("apply", tuple(outcomes)), journal.halted, later)
        journal = journal.gate_passed(index)
        write_journal(Path(fleet.folder), journal)
    return RolloutResult(waves, FleetResult("apply", tuple(outcomes)), None, ())


def _journal(fleet: Fleet, key: str, waves: tuple[tuple[str, ...], ...], resume: bool) -> Journal:
    """The journal of this rollout (same specs, same waves) to go on from, else a new one. A halted one is refused
    unless resume: its halted wave runs again, gate included."""
    found = read_journal(Path(fleet.folder))
    if found is None or found.key != key or len(found.gated) == len(waves):  # none, another, or one done
        return Journal(key, waves)
    if found.halted is not None and not resume:
        raise OpsctlError(f"this rollout halted: {found.halted}; nothing started",
                          hint="deal with what failed, then run the same command with --resume (it applies that "
                               "wave again and gates it), or change the specs (a new rollout)")
    return Journal(key, waves, found.started, found.done, None, None, found.gated)


def apply_one(loaded: LoadedSpec, options: ApplyOptions) -> Applied:
    with open_runtime(loaded, RuntimeOptions(locked=True)) as rt:
        result = apply(rt, options)
    if not result.healthy:
        health = result.status.health if result.status else "no closing look"
        raise OpsctlError(f"applied, but not healthy: {health}")
    return Applied(result)


def _wave_failure(done: list[Outcome[Applied]]) -> str | None:
    failed = [o for o in done if o.failed]
    return "; ".join(f"{o.name} failed: {o.error}" for o in failed) or None


def _gate(specs: list[LoadedSpec], seconds: float) -> str | None:
    """Every topology of the wave healthy, with the masters it had, at each look for `seconds`; the first that is
    not, named with why."""
    first = {s.spec.name: _masters(_look(s)) for s in specs}
    deadline = time.monotonic() + seconds
    while True:
        for loaded in specs:
            why = _judge(loaded, first[loaded.spec.name])
            if why is not None:
                return f"gate: {loaded.spec.name}: {why}"
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(GATE_LOOK, max(0.0, deadline - time.monotonic())))


def _judge(loaded: LoadedSpec, masters: frozenset[str] | str) -> str | None:
    if isinstance(masters, str):
        return masters
    look = _look(loaded)
    if isinstance(look, str):
        return look
    if not look.healthy:
        return f"not healthy: {look.health}"
    now = _masters(look)
    if now != masters:
        return f"failover during the gate: masters {', '.join(sorted(masters))} -> {', '.join(sorted(now))}"
    return None


def _look(loaded: LoadedSpec) -> StatusResult | str:
    try:
        with open_runtime(loaded) as rt:
            return status(rt)
    except OpsctlError as exc:
        return exc.summary


def _masters(look: StatusResult | str) -> frozenset[str] | str:
    if isinstance(look, str):
        return look
    return frozenset(row.name for row in look.nodes if row.role == "master")


