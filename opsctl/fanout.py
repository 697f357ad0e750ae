"""Run one function per item side by side (threads), for I/O on many nodes: SSH commands, SFTP reads, admin
round trips. A look at six remote nodes costs one round trip, not six in a row.

The threads are the process's own, kept from one fan-out to the next (shared_pool): a thread started while others
run costs ~1-3 ms of waiting for the GIL, and a 60-node apply that made a pool per look started ~190 of them (0.6 s
in Thread.start alone). Borrowed is a share of that pool that waits for what it submitted, as a pool of its own
would on shutdown."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import ParamSpec, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
WIDTH = 16  # threads in the shared pool: at most this many looks at once (an SSH connection allows 10 sessions)
PREFIX = "opsctl-io"

_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ThreadPoolExecutor(max_workers=WIDTH, thread_name_prefix=PREFIX)
        return _shared


class Borrowed(Executor):
    """A share of the shared pool: shutdown waits for (or cancels) what was submitted through it, and leaves the
    threads for the next. From a thread of the shared pool itself (a fan-out inside a fan-out) it is a pool of its
    own: waiting on the pool one runs in could leave every thread of it waiting."""

    def __init__(self) -> None:
        self._own = ThreadPoolExecutor(max_workers=WIDTH) if threading.current_thread().name.startswith(PREFIX) \
            else None
        self._pool = self._own or shared_pool()
        self._pending: set[Future[object]] = set()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        future = self._pool.submit(fn, *args, **kwargs)
        with self._lock:
            self._pending.add(cast("Future[object]", future))  # invariant Future: held only to wait for it
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[R]) -> None:
        with self._lock:
            self._pending.discard(future)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._own is not None:
            self._own.shutdown(wait, cancel_futures=cancel_futures)
            return
        with self._lock:
            pending = list(self._pending)
        if cancel_futures:
            for future in pending:
                future.cancel()
        if wait:
            wait_all(pending)


def fan_out(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(item) for item in items], run side by side; the first item's error (in order) is raised, once every
    item has run."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with Borrowed() as pool:
        return list(pool.map(fn, items))
