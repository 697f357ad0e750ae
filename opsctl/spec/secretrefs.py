"""The spec's secrets: how they are resolved (SecretResolver, SecretUnusable) and checked.

Which places of a spec hold secrets, read from opsctl.spec.model's declared types: a SecretRef field, a field
marked Hidden (a private key's file) and a config mapping's secret directives. An error about such a place never
quotes what was written there, nor a key below it: an inline secret is what such an error is about, and CI logs
keep error output."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from typing import Annotated

from opsctl.base.errors import echo
from opsctl.base.record import Hidden, Record, fields_of
from opsctl.spec.model import SECRET_CONFIG, ConfigValue, SecretRef, Spec
from opsctl.spec.text import is_control

Finding = tuple[tuple[str | int, ...], str, str]
SecretResolver = Callable[[SecretRef], str | None]


class SecretUnusable(ValueError):
    """Raised by a resolver: the secret's source exists but must not be used (too big, open to others, ...)."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint


def check_secrets(spec: Spec, resolve: SecretResolver) -> Iterator[Finding]:
    """The secrets a spec names: each one set, usable and strong. The only check that looks outside the spec
    text (environment, secret files), so a spec found already validated is checked here again."""
    refs: list[tuple[tuple[str | int, ...], SecretRef]] = [(("auth", "password"), spec.auth.password)]
    refs += [(("auth", "users", i, "password"), u.password) for i, u in enumerate(spec.auth.users)]
    if spec.auth.previous_password:
        refs.append((("auth", "previous_password"), spec.auth.previous_password))
    refs += [(("auth", "users", i, "previous_password"), u.previous_password)
             for i, u in enumerate(spec.auth.users) if u.previous_password]
    if spec.hardening.rename_key:
        refs.append((("hardening", "rename_key"), spec.hardening.rename_key))
    for path, ref in refs:
        try:
            value = resolve(ref)
        except SecretUnusable as exc:
            yield (path, f"secret file {ref.file} {exc.what}", exc.hint)
            continue
        if value is None:
            if ref.env:
                yield (path, f"secret not found: environment variable {ref.env} is not set or empty",
                       f"export {ref.env}=... (a random secret: openssl rand -hex 24)")
            else:
                yield (path, f"secret not found: file {ref.file} is missing, unreadable or empty",
                       f"create {ref.file} (relative paths start at the spec's folder), mode 0600, "
                       "holding only the secret")
        elif len(value) < 12 or any(c.isspace() or is_control(c) for c in value):
            yield (path, f"secret from {ref.describe()} is too weak (under 12 characters or has spaces)",
                   "use a random secret: openssl rand -hex 24")


Path = tuple[str | int, ...]

HIDDEN = "a value not shown (the field holds a secret)"
# How each field of a secret record is written, for the hint: {env: VAR} or {file: PATH}.
_PLACEHOLDERS = {"env": "VAR", "file": "PATH"}


def secret_field(path: Path) -> Path | None:
    """The start of path that names a secret place, when path is at or below one; else None."""
    _, end = _walk(path)
    return None if end is None else path[:end]


def public_path(path: Path) -> Path:
    """path as an error may name it: below a secret place, up to the first part that is no declared field (a key
    written there may be the secret)."""
    walked, end = _walk(path)
    return path[:walked] if end is not None else path


def shown(value: object, path: Path) -> str:
    """value as an error about path may quote it: echo(value), or HIDDEN at a secret place."""
    return HIDDEN if secret_field(path) is not None else echo(value)


def unquoted(text: str, value: object, path: Path) -> str:
    """text (a message that may quote value, or value stripped, with echo) with the quote replaced by HIDDEN at a
    secret place."""
    if secret_field(path) is None:
        return text
    for form in (value, value.strip()) if isinstance(value, str) else (value,):
        text = text.replace(echo(form), HIDDEN)
    return text


def secret_hint(path: Path) -> str | None:
    """How the secret place at path is written instead (its record's fields), when path is one; else None."""
    walked, end = _walk(path)
    record = _record_in(_kind_at(path)) if end == len(path) == walked else None
    if record is None:
        return None
    forms = " or ".join(f"{{{name}: {_PLACEHOLDERS.get(name, name.upper())}}}" for name in fields_of(record))
    return f"the secret stays out of the spec: write {forms}"


def holds_secret(kind: object) -> bool:
    """A declared field type names a secret: a secret record or a Hidden marker, also inside an optional, a list
    or a mapping (not inside another record's fields: those are places of their own)."""
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.SECRET
    args = typing.get_args(kind)
    if typing.get_origin(kind) is Annotated:
        return any(isinstance(marker, Hidden) for marker in args[1:]) or holds_secret(args[0])
    if typing.get_origin(kind) is typing.Literal:
        return False
    return any(holds_secret(arg) for arg in args)


def _walk(path: Path) -> tuple[int, int | None]:
    """(how many parts of path the declared types follow, the end of the first secret place on it or None)."""
    kind: object = Spec
    end: int | None = None
    for depth, part in enumerate(path):
        inner = _step(kind, part)
        if inner is None:
            return depth, end
        if end is None and (holds_secret(inner) or (inner == ConfigValue and part in SECRET_CONFIG)):
            end = depth + 1
        kind = inner
    return len(path), end


def _kind_at(path: Path) -> object:
    kind: object = Spec
    for part in path:
        kind = _step(kind, part)
    return kind


def _step(kind: object, part: str | int) -> object:
    """The declared type one part further in (a record's field, a list's item, a mapping's value), or None."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, Record):
        declared = fields_of(kind).get(part) if isinstance(part, str) else None
        return None if declared is None else declared.kind
    if origin is Annotated:
        return _step(args[0], part)
    if origin is list:
        return args[0] if isinstance(part, int) else None
    if origin is dict:
        return args[1] if isinstance(part, str) else None
    if origin is typing.Literal:
        return None
    for option in args:  # a union: the first option that has the part
        inner = _step(option, part)
        if inner is not None:
            return inner
    return None


def _record_in(kind: object) -> type[Record] | None:
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind
    for arg in typing.get_args(kind):
        found = _record_in(arg)
        if found is not None:
            return found
    return None
