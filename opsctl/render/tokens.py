"""Values as the servers' file parsers read them: redis.conf, sentinel.conf and users.acl are split into lines at every
newline, then each line into arguments by sdssplitargs (quotes, backslash escapes).

Every value a template prints passes `checked` (the Jinja finalize hook), so no control character can end a line and
start another directive; `word` and `quoted` make one argument of any text."""

from __future__ import annotations

import re

from opsctl.base.errors import OpsctlError
from opsctl.spec.text import control_chars, is_control, split_args

_BARE = re.compile(r"^[A-Za-z0-9._:/@+,=%^*~&!?<>\[\]{}()$|-]+$")


def _escaped(char: str) -> str:
    if char in '\\"':
        return "\\" + char
    if is_control(char):
        return "".join(f"\\x{byte:02x}" for byte in char.encode())
    return char


def quoted(value: str) -> str:
    """value as one double-quoted argument: quotes, backslashes and control characters escaped."""
    return '"' + "".join(_escaped(c) for c in value) + '"'


def word(value: str) -> str:
    """value as one argument: as written when that parses back the same, else quoted."""
    return value if _BARE.match(value) and not value.startswith(("#", "'")) else quoted(value)


class UnsafeValue(OpsctlError):
    """A value that would not stay one line (or one balanced argument list) in a server's file."""


def checked(value: object) -> object:
    """Jinja finalize: refuse a printed value holding a control character."""
    bad = control_chars(str(value))
    if bad:
        raise UnsafeValue(f"refusing to render a value holding control character(s) {', '.join(bad)}",
                          hint="remove newlines and other control characters from the spec "
                               "(opsctl validate names the field)")
    return value


def checked_arguments(name: str, value: str) -> None:
    """A directive's value must split into arguments the way it was built: balanced quotes, one line."""
    checked(value)
    try:
        split_args(value)
    except ValueError:
        raise UnsafeValue(f"refusing to render directive {name}: its value has unbalanced quotes",
                          hint="check the quotes in the spec's value for it") from None
