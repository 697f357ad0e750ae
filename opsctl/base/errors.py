"""One error family for the whole tool: every error says what, the detail, and how to fix it.

Library code raises these; only the CLI prints them and maps them to exit codes.

Why a node does not answer, said the same way by every command: a refused password first.

Pure: works on the error text an observation kept (or on an exception), so no redis import is needed here."""

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

    def __init__(self, problems: list[SpecProblem], spec_file: str | None = None) -> None:
        """spec_file: the spec the problems are in, when some are in its bases (`extends:`): the summary names it."""
        count = len(problems)
        file = spec_file or (problems[0].file if problems else "spec")
        super().__init__(f"{file}: {count} problem{'s' if count != 1 else ''} in the spec")
        self.problems = problems
        if problems and all(p.refusal for p in problems):
            self.exit_code = EXIT_REFUSED  # only safety rules broken: refused (3), as a plan's refusal would be

    def render(self) -> str:
        return "\n".join([f"error: {self.summary}", *(p.render() for p in self.problems)])


class RefusedError(OpsctlError):
    """A safety check refused the operation; nothing was changed."""

    exit_code = EXIT_REFUSED


class StalePlan(RefusedError):
    """A saved plan (apply --plan) no longer matches what opsctl would do now: the spec, the live topology or the
    steps moved since it was made."""


class ConvergenceError(OpsctlError):
    """Nodes did not come to agree in time; names the node that disagrees."""


AUTH_MARKERS = ("wrongpass", "noauth", "invalid password", "invalid username-password", "authentication",
                "auth <password> called without any password")
AUTH_HINT = ("the node runs with another password than the spec's: fix auth.password (its env variable or file), "
             "or, to rotate it, set auth.previous_password to the password the nodes run with (docs/rotation.md)")


TLS_MARKERS = ("ssl", "certificate verify failed", "wrong version number", "tlsv1 alert", "handshake")
SILENT_CLOSES = ("unexpected_eof_while_reading", "eof occurred in violation of protocol")  # closed, no answer
TLS_HINT = ("opsctl speaks TLS as the spec says but the node does not: a node started before tls.enabled still "
            "speaks plaintext (turning TLS on for running nodes is not automated: stop them with `opsctl destroy` "
            "without --purge, which keeps their data, then apply), or it trusts another CA (docs/tls.md)")


def is_tls_failure(error: object) -> bool:
    """True when the TLS handshake failed (plaintext node, unknown CA, wrong name). A connection closed before any
    answer (an SSH tunnel whose far end found nothing listening, a server shutting down) is no such failure: the peer
    said nothing, as a node that is down says nothing."""
    text = error_text(error).lower()
    if any(marker in text for marker in SILENT_CLOSES):
        return False
    return any(marker in text for marker in TLS_MARKERS)


def error_text(error: object) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error or "")


def is_auth_failure(error: object) -> bool:
    """True when the node answered but refused opsctl's credentials (WRONGPASS, NOAUTH, AuthenticationError)."""
    text = error_text(error).lower()
    return any(marker in text for marker in AUTH_MARKERS)


def auth_failed(node: str) -> str:
    return f"authentication failed for {node}"


def not_answering(node: str, error: object) -> str:
    """`authentication failed for n1` or `n1 does not answer (<why>)`: one phrase for every command."""
    if is_auth_failure(error):
        return auth_failed(node)
    return f"{node} does not answer ({error_text(error) or 'not running'})"


# --- the node handle's errors (opsctl.net.connection converts every client error into these) ------------------------


class NodeError(OpsctlError):
    """A node did not do what opsctl asked: it did not answer (NodeUnreachable) or it refused (NodeRefused)."""


class NodeUnreachable(NodeError):
    """No answer from a node: it is gone, stalls, closed the connection, refused opsctl's AUTH or the TLS
    handshake, or sent bytes that are not RESP. `why` is the cause in the words an observation keeps."""

    @property
    def why(self) -> str:
        cause = self.__cause__
        if cause is not None and not isinstance(cause, OpsctlError):
            return error_text(cause)
        return f"{self.summary}: {self.detail}" if self.detail else self.summary


class PipeClosed(NodeUnreachable):
    """The node closed the connection while replies were due."""


class AuthRefused(NodeUnreachable):
    """A node answered opsctl's AUTH with an error (every password the spec allows); detail: its words."""


class NodeRefused(NodeError):
    """A node answered a command with an error reply (a rename the spec does not know, an ACL, a disabled
    command, a slot it does not serve), raised naming the node and the command; detail: its words."""

    @property
    def code(self) -> str:
        """The error reply's code: its first word when upper case (BUSYKEY, MOVED, NOPERM, ERR), else ""."""
        word = self.detail.split(" ", 1)[0] if self.detail else ""
        return word if word.isupper() else ""
