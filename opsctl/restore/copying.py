"""`opsctl restore`: refuse what cannot work before writing anything, copy every source in parallel, then check
counts and values. This module runs it and keeps its journal (target, sources, checks, verify: their own modules).

Killed, the same command resumes: it skips the sources the journal names finished and re-reads the rest, counting
keys already equal as restored (docs/backup.md). SIGTERM/SIGINT stop the copy after the page in flight
(opsctl.base.stop): the finished sources are journaled and the run says how many keys it wrote.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import ClassVar

from opsctl.base import stop
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, Event, Redrawn, gauge, human_seconds
from opsctl.base.frozen import Frozen, frozen
from opsctl.net.fanout import Borrowed
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.net.topolock import check_held
from opsctl.restore.engine import Side, Source, copy_source
from opsctl.restore.functions import check_libraries
from opsctl.restore.preflight import existing_keys, refuse_unsafe
from opsctl.restore.route import JOURNAL, Counts, Journal, journal_json, landed_problem, parse_journal
from opsctl.restore.sources import Prepared, RestoreOptions, durable
from opsctl.restore.tally import checked_again, count_problems, sample_again, target_keys
from opsctl.restore.target import Target
from opsctl.state.safefs import read_bounded, write_private


@frozen
class RestoreProgress(Frozen, Event):
    """Keys written so far of total (0: unknown, a live source)."""

    kind: ClassVar[str] = "restore-progress"
    redrawn: ClassVar[Redrawn] = "bar"
    keys: int
    total: int
    keys_per_sec: int
    seconds: float

    def line(self) -> str:
        eta = (self.total - self.keys) / self.keys_per_sec if self.total and self.keys_per_sec else None
        head = (f"{gauge(self.keys, self.total, 20)} {self.keys}/{self.total} keys" if self.total
                else f"{self.keys} keys")
        return f"{head}  {self.keys_per_sec} keys/s  ETA {human_seconds(eta)}"


@frozen
class RestoreDone(Frozen, Event):
    """The restore's report; sources maps each source to its counts (keys, restored, existing, skipped,
    conflicts)."""

    kind: ClassVar[str] = "restore-done"
    source: str
    target: str
    mode: str
    dry_run: bool
    resumed: bool
    ok: bool
    keys: int
    restored: int
    existing: int
    skipped: int
    conflicts: int
    seconds: float
    keys_per_sec: int | None
    verified: int
    problems: tuple[str, ...]
    sources: Mapping[str, Mapping[str, int]]
    rechecked: bool = False  # the same restore had finished: checked again, nothing copied

    def line(self) -> str:
        if self.rechecked:
            return f"restore of {self.keys} keys had finished before: checked again, nothing copied"
        return (f"restore of {self.keys} keys {'finished' if self.ok else 'found problems'} in "
                f"{self.seconds:.1f}s")


@frozen
class RestoreDryRun(RestoreDone):
    kind: ClassVar[str] = "restore-dry-run"

    def line(self) -> str:
        return "dry run: every check passed, nothing was written"


@dataclass
class RestoreReport:
    source: str
    target: str
    mode: str
    dry_run: bool
    resumed: bool
    sources: dict[str, Counts]
    rechecked: bool = False  # finished before: checked again, nothing copied
    seconds: float = 0.0
    verified: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.sources.values():
            total.add(counts)
        return total

    def done(self, kind: type[RestoreDone] = RestoreDone) -> RestoreDone:
        """The report as the run's last event (RestoreDone, or RestoreDryRun)."""
        total = self.total
        return kind(self.source, self.target, self.mode, self.dry_run, self.resumed, not self.problems, total.total,
                    total.restored, total.existing, total.skipped, total.conflicts, round(self.seconds, 3),
                    round(total.total / self.seconds) if self.seconds > 0 else None, self.verified,
                    tuple(self.problems),
                    {k: {"keys": c.total, "restored": c.restored, "existing": c.existing, "skipped": c.skipped,
                         "conflicts": c.conflicts, "libraries": c.libraries} for k, c in self.sources.items()},
                    self.rechecked)


# --- the journal -------------------------------------------------------------------------------------------------


def journal_path(state_dir: Path) -> Path:
    return state_dir / JOURNAL


def load_journal(state_dir: Path, prepared: Prepared, mode: str) -> Journal | None:
    """The journal of this restore: an unfinished one to resume, or a finished one of the same source and mode
    (run_restore decides what it is worth); None for none, or a finished one of another restore."""
    path = journal_path(state_dir)
    text = read_bounded(path, "remove it to start over (keys already restored then count as existing keys)")
    if text is None:
        return None
    journal = parse_journal(text, str(path))
    same = (journal.source, journal.mode) == (prepared.id, mode)
    if journal.finished:
        return journal if same else None
    if not same:
        raise RefusedError("an unfinished restore from another source or in another mode is recorded",
                           f"{path}: source {journal.source}, mode {journal.mode}",
                           "re-run that restore to finish it, or remove the file to start over")
    return journal


def save_journal(state_dir: Path, journal: Journal) -> None:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(journal_path(state_dir), journal_json(journal))


# --- the run -------------------------------------------------------------------------------------------------------


class Meter:
    """Keys written so far, as throttled `restore-progress` events."""

    def __init__(self, emit: Emit, total: int) -> None:
        self.emit, self.total, self.done = emit, total, 0
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.last = 0.0

    def __call__(self, keys: int) -> None:
        with self.lock:
            self.done += keys
            done, now = self.done, time.monotonic()
            if now - self.last < 0.25:
                return
            self.last = now
        elapsed = max(1e-6, now - self.started)
        self.emit(RestoreProgress(done, self.total, round(done / elapsed), round(elapsed, 3)))


def run_restore(target: Target, prepared: Prepared, state_dir: Path, options: RestoreOptions,
                emit: Emit) -> RestoreReport:
    journal = load_journal(state_dir, prepared, options.mode)
    if journal is not None and journal.finished:
        existing = existing_keys(prepared, target) if options.mode == "fail-if-exists" and target.keys else (0, [])
        if existing[0]:
            return recheck_finished(target, prepared, state_dir, options, journal, existing, emit)
        journal = None  # replace and skip-existing run again in full; so does a target without the source's keys
    refuse_unsafe(prepared, target, options, journal is not None)
    targets = target.targets()
    check_libraries({s.label: s.open for s in prepared.sources},
                    [partial(targets.open, index) for index in range(len(targets.names))])
    report = RestoreReport(prepared.text, target.loaded.spec.name, options.mode, options.dry_run, journal is not None,
                           dict(journal.done) if journal else {})
    if options.dry_run:
        return report
    journal_was_new = journal is None
    journal = journal or Journal(prepared.id, options.mode)
    save_journal(state_dir, journal)
    started = time.monotonic()
    todo = [s for s in prepared.sources if s.key not in journal.done]
    sample_again([s for s in prepared.sources if s not in todo], options)  # copied by a run killed before its checks
    meter = Meter(emit, sum(e.total_keys for e in prepared.expected.values()))

    def written(keys: int) -> None:
        check_held(target.connector)  # paused past the lock's lease: stop before writing more (a re-run resumes)
        meter(keys)
        stop.check()  # a safe point: the page sent is collected, the next one not sent
    lock = threading.Lock()

    def one(source: Source) -> None:
        compare = Side(source.open, target.targets().open)
        try:
            counts = copy_source(source, target.targets(), options.mode, written, compare)
        except PIPE_ERRORS as exc:
            raise OpsctlError(f"the restore of {source.label} stopped: {type(exc).__name__}: {exc}",
                              hint="re-run the same command when the nodes answer again: it resumes") from None
        finally:
            compare.close()
        with lock:
            assert journal is not None
            journal.done[source.key] = counts
            report.sources[source.key] = counts
            save_journal(state_dir, journal)

    try:
        with stop.finishing("the restore's copy"), Borrowed() as pool:  # every source at once; waits for all
            for future in [pool.submit(one, s) for s in todo]:
                future.result()
    except stop.Stopped as exc:
        raise _stopped(exc, meter.done, len(journal.done), len(prepared.sources), journal_path(state_dir)) from None
    report.seconds = time.monotonic() - started
    report.problems = durability_problems(target) + count_problems(report.sources, prepared)
    report.problems += [p for s in todo if s.confirm is not None and (p := s.confirm()) is not None]
    started_empty = journal_was_new and target.keys == 0  # else restored keys may have replaced others
    if started_empty and (problem := landed_problem(0, target_keys(target), report.total)):
        report.problems.append(problem)
    report.verified, problems = checked_again(prepared, target, options, {s.key for s in todo})
    report.problems += problems
    if report.problems:  # a re-run reads every source again and checks again, not trusting the finished ones
        journal.done.clear()
    journal.finished = not report.problems
    save_journal(state_dir, journal)
    emit(report.done())
    return report


def _stopped(exc: stop.Stopped, keys: int, finished: int, sources: int, journal: Path) -> stop.Stopped:
    """What a stopped copy did: keys written, sources finished (journaled in journal), and how it resumes."""
    return stop.Stopped(exc.signum, f"wrote {keys} keys; {finished} of {sources} sources finished, journaled in "
                        f"{journal}; not verified", "run the same command again: it resumes (skips the finished "
                        "sources, counts keys already there and equal as restored) and verifies")


def durability_problems(target: Target) -> list[str]:
    """Each target master's writes held by a replica (where its shard has or should have one): an acknowledged
    RESTORE on a master cut off from its replicas is lost when a replica takes over."""
    layout = target.loaded.layout
    wanted = [bool((shard := layout.shard_of(m.name)) and shard.replicas) for m in target.masters]
    problems = durable(target.connector, target.masters, wanted)
    if problems:
        problems.append("not durable: re-run the same command once every master's replica is linked again (it "
                        "resumes and copies what a failover threw away)")
    return problems


def recheck_finished(target: Target, prepared: Prepared, state_dir: Path, options: RestoreOptions,
                     journal: Journal, existing: tuple[int, list[str]], emit: Emit) -> RestoreReport:
    """The same restore finished here before (its journal says so) and the source's keys are on the target: a
    run killed after its checks passed, run again, or the same restore asked for twice. Nothing is copied; the
    counts and the sampled keys are checked again, and a target that no longer matches gets the refusal a fresh
    run would get. The journal stays as it was."""
    report = RestoreReport(prepared.text, target.loaded.spec.name, options.mode, options.dry_run, True,
                           dict(journal.done), rechecked=True)
    sample_again(prepared.sources, options)  # reads only: a dry run checks as much
    report.verified, problems = checked_again(prepared, target, options, set())
    problems = count_problems(report.sources, prepared) + problems
    if problems:
        found, names = existing
        raise RefusedError(f"{found} keys of the source already exist on the target (nothing was written)",
                           f"a restore of this source finished here before ({journal_path(state_dir)}); checked "
                           "again, the target no longer matches it:\n" + "\n".join(problems[:5])
                           + "\nfor example: " + ", ".join(repr(n) for n in names),
                           "--mode replace overwrites them, --mode skip-existing keeps the target's")
    if not options.dry_run:
        emit(report.done())
    return report

