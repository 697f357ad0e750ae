"""opsctl.base.poll: what a wait that timed out says (the last reason whole, the earlier ones with when)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from opsctl.base.errors import ConvergenceError
from opsctl.base.poll import Pending, Progress, ReasonLog, wait_for


def _timeout_detail(reasons: Iterator[str]) -> str:
    with pytest.raises(ConvergenceError) as raised:
        wait_for(lambda: Pending(next(reasons)), 0.05, "the test", interval=0.002)
    assert raised.value.summary == "timed out after 0.05s waiting for the test"
    return raised.value.detail


def test_one_reason_all_along_is_said_alone() -> None:
    assert _timeout_detail(itertools.repeat("n1: replica link is down")) == "n1: replica link is down"


def test_earlier_reasons_are_said_with_when_and_only_their_first_line() -> None:
    reasons = itertools.chain(["n2: loading"] * 2, ["n1: a\nn3: b"] * 2, itertools.repeat("n1: not online"))
    lines = _timeout_detail(reasons).splitlines()
    assert lines[0] == "n1: not online" and lines[1].startswith("(since ") and lines[1].endswith("before that:")
    assert lines[2].endswith(" s: n2: loading") and lines[3].endswith(" s: n1: a (+1 more line))")
    assert len(lines) == 4


def test_the_history_keeps_the_last_few_and_an_empty_reason_is_named() -> None:
    log = ReasonLog(0.0)
    for reason in ["r1", "r2", "r3", "r4", "r5", "r6", ""]:
        log.note(reason)
    rendered = log.render().splitlines()
    assert rendered[0] == "no reason given"
    assert [line.rsplit(": ", 1)[1].rstrip(")") for line in rendered[2:]] == ["r3", "r4", "r5", "r6"]
    assert ReasonLog(0.0).render() == "no reason given"


def test_a_wait_that_builds_its_own_error_gets_the_last_reason_only() -> None:
    reasons = itertools.chain(["first"], itertools.repeat("last"))
    with pytest.raises(RuntimeError, match=r"^last$"):
        wait_for(lambda: Pending(next(reasons)), 0.02, "x", interval=0.002, on_timeout=RuntimeError)


def test_a_result_ends_the_wait() -> None:
    answers = iter([Pending("not yet"), None, 7])
    assert wait_for(lambda: next(answers), 1.0, "x", interval=0.001) == 7


def test_a_wait_that_sees_progress_goes_on_past_its_stall_budget() -> None:
    """left falls by one every look: far more looks than one stall budget holds, and the wait still ends well."""
    counts = iter(range(40, -1, -1))

    def check() -> bool | Pending:
        left = next(counts)
        return True if left == 0 else Pending(f"{left} nodes still joining", left)

    started = time.monotonic()
    assert wait_for(check, 30.0, "x", interval=0.003, stall=0.02) is True
    assert time.monotonic() - started > 0.02 * 2  # longer than the stall budget: progress kept it going


def test_a_wait_that_sees_no_progress_fails_after_its_stall_budget_naming_what_is_stuck() -> None:
    counts = iter([5, 4, 3])

    def check() -> Pending:
        left = next(counts, 3)
        return Pending(f"node-{left} does not know its master yet", left)

    started = time.monotonic()
    with pytest.raises(ConvergenceError) as caught:
        wait_for(check, 30.0, "every replica to know its master", interval=0.002, stall=0.05)
    assert time.monotonic() - started < 25.0  # the stall ended it, not the 30 s cap
    summary, detail = caught.value.summary, caught.value.detail
    assert summary.startswith("no progress for") and "(3 of 5 still waited for, the fewest seen)" in summary
    assert summary.endswith("waiting for every replica to know its master")
    assert detail.startswith("node-3 does not know its master yet")


def test_a_count_that_rises_again_is_not_progress() -> None:
    progress = Progress(0.0, stall=1.0)
    progress.note(3, now=0.0)
    progress.note(5, now=0.5)  # a node lost ok again: not a new fewest
    assert progress.since == 0.0 and progress.stalled(1.0)
    progress.note(2, now=1.1)
    assert not progress.stalled(2.0) and progress.stalled(2.1)


def test_without_counts_or_stall_only_the_timeout_ends_a_wait() -> None:
    assert not Progress(0.0, stall=None).stalled(1e9)
    uncounted = Progress(0.0, stall=1.0)
    uncounted.note(None, now=0.0)
    assert not uncounted.stalled(1e9)
