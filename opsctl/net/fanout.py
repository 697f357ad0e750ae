"""Run one function per item side by side (threads), for I/O on many nodes (SSH, SFTP, admin round trips): a look at
many nodes costs one round trip, not one per node.

One process-wide pool (shared_pool) reuses an idle thread, else starts one, up to POOL_LIMIT: no work waits behind
other work, nested fan-outs included. Borrowed is a share of the pool that waits for what it submitted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import ParamSpec, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
WIDTH = 16  # items of one fan_out at once (each an SSH command, say: sshd allows 10 sessions a connection)
POOL_LIMIT = 256  # threads at most; tasks queue only past this many running at once

_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ThreadPoolExecutor(max_workers=POOL_LIMIT, thread_name_prefix="opsctl-io")
        return _shared


class Borrowed(Executor):
    """A share of the shared pool: shutdown waits for (or cancels) what was submitted through it and leaves the
    threads for the next; nothing is accepted after it."""

    def __init__(self) -> None:
        self._pending: set[Future[object]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a Borrowed pool after its shutdown")
            future = shared_pool().submit(fn, *args, **kwargs)
            self._pending.add(cast("Future[object]", future))  # invariant Future: held only to wait for it
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[R]) -> None:
        with self._lock:
            self._pending.discard(cast("Future[object]", future))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        if cancel_futures:
            for future in pending:
                future.cancel()
        if wait:
            wait_all(pending)


def fan_out(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(item) for item in items], at most WIDTH at once. After an error no further item is started; once the
    running ones ended, the error of the first item (in order) that failed is raised."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    results: dict[int, R] = {}
    errors: dict[int, BaseException] = {}
    running: dict[Future[R], int] = {}
    upcoming = iter(range(len(items)))
    with Borrowed() as pool:
        while True:
            while len(running) < WIDTH and not errors and (index := next(upcoming, None)) is not None:
                running[pool.submit(fn, items[index])] = index
            if not running:
                break
            done, _ = wait_all(running, return_when=FIRST_COMPLETED)
            for future in done:
                index = running.pop(future)
                error = future.exception()
                if error is None:
                    results[index] = future.result()
                else:
                    errors[index] = error
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(items))]
