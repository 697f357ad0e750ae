"""The spec's secrets: how they are resolved (SecretResolver, SecretUnusable) and checked."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from opsctl.spec.model import SecretRef, Spec
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
