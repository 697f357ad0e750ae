"""One line redrawn in place on a terminal (progress bars), safe from several threads."""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

CLEAR_LINE = "\r\x1b[K"  # carriage return, erase to the end of the line


def redraw(line: str, columns: int) -> str:
    """What replaces the current terminal line by `line`: CR, the line cut to columns - 1, erase to the end. Pure."""
    return "\r" + line[:max(1, columns - 1)] + "\x1b[K"


class TtyLine:
    """A status line redrawn in place on a terminal stream; `show` at most every `interval` s, `done` always."""

    def __init__(self, stream: TextIO, interval: float = 0.1) -> None:
        self.stream = stream
        self.interval = interval
        self._last = -interval
        self._lock = threading.Lock()

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80  # a pty never sized says 0
        except (OSError, ValueError):
            return 80

    def show(self, line: str, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last < self.interval:
                return
            self._last = now
            self.stream.write(redraw(line, self._columns()))
            self.stream.flush()

    def done(self, line: str) -> None:
        """Draw the final state and end the line, so what follows starts on a clean line."""
        self.show(line, force=True)
        with self._lock:
            self.stream.write("\n")
            self.stream.flush()
