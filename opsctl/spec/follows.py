"""The checks of `follows:` (a standby's primary, docs/standby.md) that one field's own type cannot make: each
endpoint as `migrate --from-endpoints` takes it (the same words), the primary's password set, its TLS files
there. Pure but for the resolver (the environment and secret files, as every secret check)."""

from __future__ import annotations

from collections.abc import Iterator

from opsctl.base.errors import echo
from opsctl.base.secrets import mask_login
from opsctl.spec.layout import split_endpoint, valid_port
from opsctl.spec.model import Spec
from opsctl.spec.secretrefs import SecretResolver, SecretUnusable

Finding = tuple[tuple[str | int, ...], str, str]
ENDPOINT_HINT = "HOST:PORT, e.g. 10.0.0.5:6380 or [fd00::5]:6380; the password goes in follows.password"


def endpoint_problem(text: str) -> str | None:
    """Why text is no HOST:PORT (None: it is one): a login in it (never echoed), a bad port, a bad host."""
    if "@" in text:  # a password may hold `,` or `:`: nothing before the last @ is echoed
        return f"{echo(mask_login(text))} holds a login: give HOST:PORT alone"
    if split_endpoint(text) is None:
        port = text.rpartition(":")[2]
        why = "" if not port or valid_port(port) else " (the port must be a number from 1 to 65535)"
        return f"{echo(text)} is not HOST:PORT{why}"
    return None


def check_follows(spec: Spec, resolve: SecretResolver | None) -> Iterator[Finding]:
    follows = spec.follows
    if follows is None:
        return
    for index, text in enumerate(follows.endpoints or []):
        problem = endpoint_problem(text)
        if problem:
            yield (("follows", "endpoints", index), problem, ENDPOINT_HINT)
    if follows.password is not None and resolve is not None:
        yield from _check_password(follows.password, resolve)


def _check_password(ref: object, resolve: SecretResolver) -> Iterator[Finding]:
    from opsctl.spec.model import SecretRef

    assert isinstance(ref, SecretRef)
    path = ("follows", "password")
    try:
        value = resolve(ref)
    except SecretUnusable as exc:
        yield (path, f"secret file {ref.file} {exc.what}", exc.hint)
        return
    if value is None:
        yield (path, f"the primary's password is not found: {ref.describe()} is not set, missing or empty",
               "the password the primary's clients use; a file holding only it, mode 0600, or an exported variable")
