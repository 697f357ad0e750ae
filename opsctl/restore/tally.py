"""What a restore checks after its copy: each source's counts balance and match its manifest, and the sampled keys
(or every key, with verify=full) are equal on the target."""

from __future__ import annotations

from opsctl.backup.manifest import count_problem
from opsctl.backup.savers import parse_keyspace
from opsctl.base.errors import OpsctlError
from opsctl.net.connection import connection_to
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.observe.replies import info
from opsctl.restore.engine import Side, Source, TargetPipes, compare_page, first_entries, pages
from opsctl.restore.route import Counts
from opsctl.restore.sources import Prepared, RestoreOptions
from opsctl.restore.target import Target

MAX_PROBLEMS = 20


def sample_again(sources: list[Source], options: RestoreOptions) -> None:
    """Samples for sources copied by an earlier run (their copy's samples went with it)."""
    for source in sources if options.verify == "sample" else []:
        source.samples = first_entries(source, options.sample)


def checked_again(prepared: Prepared, target: Target, options: RestoreOptions,
                  copied: set[str]) -> tuple[int, list[str]]:
    try:
        return verify(prepared, target, options, copied)
    except PIPE_ERRORS as exc:
        raise OpsctlError(f"the checks after the copy stopped: {type(exc).__name__}: {exc}",
                          hint="re-run the same command when the nodes answer again: it resumes and checks") from None


def target_keys(target: Target) -> int:
    """Keys on the target masters now, every db."""
    total = 0
    for master in target.masters:
        with connection_to(target.connector, master) as handle:
            keyspace = handle.read(info("keyspace"))
        total += sum(k for k, _ in parse_keyspace(keyspace).values())
    return total


def count_problems(sources: dict[str, Counts], prepared: Prepared) -> list[str]:
    """Each source's counts: they balance, no key conflicted, and a backup shard's keys are all there."""
    problems = []
    for key, counts in sorted(sources.items()):
        balance = counts.balance_problem()
        if balance:
            problems.append(f"{key}: {balance}")
        if counts.conflicts:
            problems.append(f"{key}: {counts.conflicts} keys exist on the target with another value, e.g. "
                            + ", ".join(repr(k) for k in counts.conflict_keys))
        shard = prepared.expected.get(key)
        if shard is not None and (problem := count_problem(shard, counts.scanned)):
            problems.append(f"{key} ({shard.file}): {problem}")
    return problems


def verify(prepared: Prepared, target: Target, options: RestoreOptions, copied: set[str]) -> tuple[int, list[str]]:
    """The sampled keys (or, with verify=full, every key read again) compared with the target. Under
    skip-existing a key the target had keeps its own value: the samples this run copied leave those out (they
    are known), the others (copied by an earlier run, or all keys with verify=full) are checked for presence."""
    checked, problems = 0, []
    skip_existing = options.mode == "skip-existing"
    for source in prepared.sources if options.verify == "sample" else []:
        compare = Side(source.open, target.targets().open)
        tp = TargetPipes(target.targets())
        samples = [e for e in source.samples if (e.db, e.key) not in source.kept]
        try:
            for db in sorted({e.db for e in samples}):
                tp.select(db)
                page = [e for e in samples if e.db == db]
                problems += compare_page(tp, page, compare, skip_existing and source.key not in copied)
                checked += len(page)
        finally:
            tp.close()
            compare.close()
    for source in prepared.sources if options.verify == "full" else []:
        n, found = verify_all(source, target, skip_existing)
        checked += n
        problems += found
    return checked, problems[:MAX_PROBLEMS]


def verify_all(source: Source, target: Target, kept: bool) -> tuple[int, list[str]]:
    compare = Side(source.open, target.targets().open)
    tp = TargetPipes(target.targets())
    src = source.open()
    checked, problems = 0, []
    try:
        for db in source.dbs:
            tp.select(db)
            for page in pages(src, db, source.label):
                problems += compare_page(tp, page, compare, kept)
                checked += len(page)
                if len(problems) >= MAX_PROBLEMS:
                    return checked, problems
    finally:
        src.close()
        tp.close()
        compare.close()
    return checked, problems
