"""The one printer: a command's result on stdout (text, or JSON in a versioned envelope) and its events on stderr
as text (a redrawn line on a terminal) or JSON lines. backup and restore print their JSON event lines on stdout
instead, the last one being the result: that line carries the envelope's format_version."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol, TextIO

from opsctl.base.events import HEARTBEAT, Event, Note, as_dict
from opsctl.cli.ttyline import CLEAR_LINE, TtyLine


class Printer:
    """Events on a stream (stderr by default): JSON lines, or text; on a terminal progress (`redrawn`) is one bar
    redrawn in place; elsewhere progress is a heartbeat, a plain line at most every `heartbeat` seconds (a CI log
    shows the run is alive and how far it got), never a control character. results: the events that end a run
    (backup, restore), printed inside the envelope as every result is. Thread-safe: slot movers and restore sources
    print at once."""

    def __init__(self, json_mode: bool, stream: TextIO | None = None,
                 results: tuple[type[Event], ...] = (), heartbeat: float = HEARTBEAT) -> None:
        self.json_mode = json_mode
        self.stream = stream or sys.stderr
        self.results = results
        self.bar = TtyLine(self.stream) if not json_mode and self.stream.isatty() else None
        self.heartbeat = heartbeat
        self._beat = time.monotonic()  # when the last heartbeat line was printed: a run shorter than one, none
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            if self.json_mode:
                line = as_dict(event)
                self._line(json.dumps(envelope(line) if isinstance(event, self.results) else line, default=str))
            elif event.redrawn == "line":
                self._clear()
                self._line(event.line())
            elif event.redrawn == "bar-last":
                if self.bar:
                    self.bar.done(event.line())
                else:
                    self._line(event.line())
            elif self.bar:
                self.bar.show(event.line(), force=True)
            elif event.redrawn == "bar" and time.monotonic() - self._beat >= self.heartbeat:
                self._beat = time.monotonic()
                self._line(event.line())

    def close(self) -> None:
        """Erase a bar left drawn, so what is printed next starts on a clean line."""
        with self._lock:
            self._clear()
            self.stream.flush()

    def _clear(self) -> None:
        if self.bar:
            self.stream.write(CLEAR_LINE)

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


@contextmanager
def printing(json_mode: bool, stream: TextIO | None = None,
             results: tuple[type[Event], ...] = ()) -> Iterator[Printer]:
    """A Printer for the block, its bar erased at the end (also when the block fails)."""
    printer = Printer(json_mode, stream, results)
    try:
        yield printer
    finally:
        printer.close()


def say(text: str, json_mode: bool, stream: TextIO | None = None) -> None:
    """A line for people outside a run's events (a note, a warning), through the printer: as text on stream
    (stderr by default), as a JSON `note` event line under --output json."""
    Printer(json_mode, stream)(Note(text))


# The version of every JSON result's shape: raised when a key a reader may rely on changes meaning or goes away
# (a new key does not raise it).
FORMAT_VERSION = 1


class TextResult(Protocol):
    """What a command prints on stdout when it is done, as text for people: the whole result of a command without
    --output json; backup's and restore's text result (as JSON, theirs is the last event line)."""

    def text(self) -> str: ...


class Result(TextResult, Protocol):
    """What a command prints on stdout when it is done: text for people, an object for --output json."""

    def to_dict(self) -> Mapping[str, object]: ...


def envelope(result: Mapping[str, object]) -> dict[str, object]:
    """The JSON object a command prints: the result's own keys at the top level, unchanged, and format_version
    first, so a script can tell which shape it reads."""
    return {"format_version": FORMAT_VERSION, **result}


def print_result(result: Result, output: str) -> None:
    """A result on stdout: its envelope as indented JSON when output is "json", else its text. A value JSON has
    no form for (a path, a timestamp) prints as its str."""
    print(json.dumps(envelope(result.to_dict()), indent=2, default=str) if output == "json" else result.text())


def print_text(result: TextResult) -> None:
    """A text result on stdout."""
    print(result.text())


class Lines:
    """What a command did, told node by node as it goes (destroy): as text each line on stdout at once (the result,
    printed as it forms); as JSON each line an event on stderr, and all of them again in the result at the end."""

    def __init__(self, output: str) -> None:
        self.json_mode = output == "json"
        self.lines: list[str] = []
        self._events = Printer(True) if self.json_mode else None

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self._events is not None:
            self._events(Note(line))
        else:
            print(line, flush=True)
