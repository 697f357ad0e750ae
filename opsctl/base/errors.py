"""One error family for the whole tool: every error says what, the detail, and how to fix it.

Library code raises these; only the CLI prints them and maps them to exit codes.
"""

from __future__ import annotations

from typing import NamedTuple

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_REFUSED = 3
EXIT_FINDINGS = 4
ECHO_LIMIT = 80
SUMMARY_LIMIT = 600


def clip(text: str, limit: int = 4 * ECHO_LIMIT) -> str:
    """A message that may embed user input, cut to limit characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """A user-supplied value as an error message may quote it: repr, cut to limit characters (input is unbounded).
    Strings are quoted; other values (numbers, lists from a spec) show as Python writes them. A URL's secret parts
    (user:password@, a signed query) are masked: whatever the user typed may hold one."""
    from opsctl.base.secrets import mask_url

    if isinstance(value, str):
        value = mask_url(value)
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class OpsctlError(Exception):
    """Base class: a summary line, optional detail lines, and a hint."""

    exit_code = EXIT_ERROR

    def __init__(self, summary: str, detail: str = "", hint: str = "") -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail
        self.hint = hint

    def render(self) -> str:
        lines = [f"error: {clip(self.summary, SUMMARY_LIMIT)}"]
        if self.detail:
            lines.extend(f"  {clip(line, SUMMARY_LIMIT)}" for line in self.detail.splitlines())
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


class SpecProblem(NamedTuple):
    """One problem in a spec file: where (file:line, field path), what, and how to fix it. A NamedTuple, not a
    dataclass: every command imports this module, and dataclasses costs `opsctl --help` its import."""

    file: str
    line: int | None
    field: str
    message: str
    hint: str = ""
    refusal: bool = False  # a safety rule the spec breaks (e.g. anti-affinity), not malformed input

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        message = clip(self.message, SUMMARY_LIMIT)  # messages may quote a value or a path from the spec whole
        text = f"{where}: {self.field}: {message}" if self.field else f"{where}: {message}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class SpecError(OpsctlError):
    """A spec with one or more problems; all are reported at once."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        count = len(problems)
        file = problems[0].file if problems else "spec"
        super().__init__(f"{file}: {count} problem{'s' if count != 1 else ''} in the spec")
        self.problems = problems
        if problems and all(p.refusal for p in problems):
            self.exit_code = EXIT_REFUSED  # only safety rules broken: refused (3), as a plan's refusal would be

    def render(self) -> str:
        return "\n".join([f"error: {self.summary}", *(p.render() for p in self.problems)])


class RefusedError(OpsctlError):
    """A safety check refused the operation; nothing was changed."""

    exit_code = EXIT_REFUSED


class ConvergenceError(OpsctlError):
    """Nodes did not come to agree in time; names the node that disagrees."""
