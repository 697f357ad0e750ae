"""opsctl.base.poll: what a wait that timed out says (the last reason whole, the earlier ones with when)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from opsctl.base.errors import ConvergenceError
from opsctl.base.poll import Pending, ReasonLog, wait_for


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
