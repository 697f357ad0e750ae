"""opsctl.net.fanout: one kept pool of I/O threads, shared by fan_out and every Observer (pure threading, no server)."""

from __future__ import annotations

import threading
import time

import pytest

from opsctl.net.fanout import WIDTH, Borrowed, fan_out


def test_results_in_order_and_threads_kept_for_the_next_fan_out() -> None:
    threads: set[threading.Thread] = set()  # the objects, kept: an ident may be reused by a new thread

    def square(i: int) -> int:
        threads.add(threading.current_thread())
        return i * i
    for _ in range(20):
        assert fan_out(square, list(range(40))) == [i * i for i in range(40)]
    # kept and reused: 20 fan_outs of WIDTH at once, each on threads of its own, would take 20 * WIDTH threads. On a
    # loaded machine a thread idle a moment after its result lets the pool add one, so the bound is loose
    assert len(threads) <= 8 * WIDTH


def test_at_most_width_at_once_and_no_item_started_after_an_error() -> None:
    running, most, started = [0], [0], []
    lock = threading.Lock()

    def one(i: int) -> int:
        with lock:
            started.append(i)
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        if i in (3, 5):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 3"):
        fan_out(one, list(range(200)))
    assert most[0] <= WIDTH and len(started) < 200


def test_a_fan_out_never_waits_behind_other_work() -> None:
    """The topology lock's renewal fans out beside a slow start: its looks run at once, not after the start's."""
    slow = threading.Thread(target=lambda: fan_out(lambda _: time.sleep(5.0), list(range(48))))
    slow.start()
    try:
        time.sleep(0.1)
        began = time.monotonic()
        assert fan_out(lambda i: i, [1, 2]) == [1, 2]
        assert time.monotonic() - began < 4.0  # behind the slow work it would take 5 s
    finally:
        slow.join()


def test_fan_outs_inside_fan_outs_finish() -> None:
    outer = Borrowed()
    try:
        sums = fan_out(lambda i: sum(outer.map(lambda j: i * j, range(3))) + sum(fan_out(abs, [-i, i])), range(32))
    finally:
        outer.shutdown()
    assert sums == [3 * i + 2 * i for i in range(32)]


def test_a_borrowed_share_waits_for_its_own_work_and_then_takes_no_more() -> None:
    done: list[int] = []
    with Borrowed() as pool:
        for i in range(5):
            pool.submit(lambda i=i: (time.sleep(0.02), done.append(i)))
    assert sorted(done) == list(range(5))
    with pytest.raises(RuntimeError, match="after its shutdown"):
        pool.submit(print)
