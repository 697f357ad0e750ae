"""The I/O edge of spec loading: read the file, resolve secrets from the environment and from files."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.base.errors import OpsctlError
from opsctl.base.secrets import remember
from opsctl.spec.load import LoadedSpec, load_spec, loaded_spec, make_resolver
from opsctl.spec.secretrefs import SecretResolver, SecretUnusable, check_secrets
from opsctl.spec.text import MAX_SPEC_CHARS
from opsctl.state import speccache
from opsctl.state.safefs import FileProblem, read_bounded

if TYPE_CHECKING:
    from opsctl.spec.yamlpos import PositionedDocument

SPEC_LIMIT = MAX_SPEC_CHARS
SECRET_FILE_LIMIT = 64 * 1024
STDIN = "-"  # -f -: the spec comes on standard input
STDIN_NAME = "<stdin>"  # its name in messages; as a path its folder is the working directory
STDIN_RULE = ("a spec on standard input (-f -) has no folder of its own: relative paths in it (secret files, "
              "server.binary, TLS files) start at the working directory, and commands that keep state need "
              "--state-dir")
_stdin_read: list[bool] = []  # standard input holds one spec: a second read of it is refused, not empty


def read_spec(path: str | Path, env: Mapping[str, str] | None = None, secrets: bool = True,
              cached: bool = True) -> LoadedSpec:
    """The spec at path, validated. secrets=False checks all but the secrets; cached reads a spec validated before back
    from opsctl.state.speccache (secrets checked again), else validates it in full and stores it where its folder has a
    .opsctl folder. path "-" reads standard input (relative paths from the working directory; nothing cached)."""
    return read_spec_to_keep(path, env, secrets, cached)[0]


def read_spec_to_keep(path: str | Path, env: Mapping[str, str] | None = None, secrets: bool = True,
                      cached: bool = True) -> tuple[LoadedSpec, Callable[[], None]]:
    """read_spec, and what keeps a spec validated in full beside it where no .opsctl folder was yet (making it):
    plan and apply call it once their runtime is set up, so that a spec or a machine they refuse leaves nothing
    behind, and `plan` then `apply` of a new topology validate once. A no-op where nothing is left to keep."""
    from_stdin = str(path) == STDIN
    spec_path = Path(STDIN_NAME if from_stdin else path)
    text = _stdin_text() if from_stdin else \
        read_bounded(spec_path, "pass the topology spec (a YAML file) with -f", limit=SPEC_LIMIT, follow=True)
    if text is None:
        raise OpsctlError(f"spec file not found: {spec_path}", hint="pass the topology file with -f")

    def read_file(name: str) -> str | None:
        secret_path = Path(name) if Path(name).is_absolute() else spec_path.parent / name
        return read_secret_file(secret_path)

    resolve = make_resolver(os.environ if env is None else env, read_file) if secrets else None
    if from_stdin:  # validated in full every time: it has no folder to keep the result in
        loaded, keep = load_spec(text, STDIN_NAME, resolve), _nothing
    else:
        loaded, keep = _validated(text, spec_path, resolve, cached)
    for secret in loaded.credentials.all():
        remember(secret)
    return loaded, keep


def _validated(text: str, spec_path: Path, resolve: SecretResolver | None,
               cached: bool) -> tuple[LoadedSpec, Callable[[], None]]:
    """The spec validated in full, or read back from the cache when it holds these bytes and the secrets pass;
    and what keeps it beside the spec when there was no cache folder to keep it in. A spec that may extend a base
    (its text says `extends` anywhere) is validated in full every time: its entry's key would cover its bytes only."""
    if not speccache.cacheable(text):
        return load_spec(text, str(spec_path), resolve), _nothing
    entry = speccache.entry_path(spec_path) if resolve is not None else None
    key = speccache.entry_key(text)
    spec = speccache.read_entry(entry, key) if entry is not None and cached else None
    if spec is not None and resolve is not None and not any(check_secrets(spec, resolve)):
        return loaded_spec(str(spec_path), spec, resolve), _nothing
    loaded = load_spec(text, str(spec_path), resolve)
    if resolve is None:
        return loaded, _nothing
    if entry is not None:
        speccache.write_entry(entry, key, loaded.spec)
        return loaded, _nothing

    def keep() -> None:
        made = speccache.entry_path(spec_path, make_root=True)
        if made is not None:
            speccache.write_entry(made, key, loaded.spec)
    return loaded, keep


def spec_origins(path: str | Path) -> list[str]:
    """The spec at path merged with its bases (`extends:`), one line per value with the file:line it came from;
    validated first (secrets not checked: this view shows none)."""
    from opsctl.spec.extends import origins

    doc = _merged(path)
    return list(origins(doc)) if doc is not None else []


def spec_origin_entries(path: str | Path) -> list[dict[str, object]]:
    """spec_origins as JSON entries (plan --output json --show-origins): field, value (secrets hidden), origin."""
    from opsctl.spec.extends import origin_entries

    doc = _merged(path)
    return origin_entries(doc) if doc is not None else []


def _merged(path: str | Path) -> PositionedDocument | None:
    from opsctl.spec.extends import merged_document

    spec_path = Path(STDIN_NAME if str(path) == STDIN else path)
    text = _stdin_text() if str(path) == STDIN else \
        read_bounded(spec_path, "pass the topology spec (a YAML file) with -f", limit=SPEC_LIMIT, follow=True)
    if text is None:
        raise OpsctlError(f"spec file not found: {spec_path}", hint="pass the topology file with -f")
    load_spec(text, str(spec_path), None)
    doc, _ = merged_document(text, str(spec_path))
    return doc


def _nothing() -> None:
    return None


def _stdin_text() -> str:
    """The spec on standard input, read once (at most SPEC_LIMIT bytes of UTF-8)."""
    hint = "pipe one topology spec (YAML, UTF-8) into -f -"
    if _stdin_read:
        raise OpsctlError("standard input holds one spec and it was read already", hint=(
            "give '-' to one spec option only; pass the other spec as a file"))
    _stdin_read.append(True)
    data = sys.stdin.buffer.read(SPEC_LIMIT + 1)
    if len(data) > SPEC_LIMIT:
        raise OpsctlError(f"{STDIN_NAME}: the spec is too big (more than {SPEC_LIMIT} bytes)", hint=hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpsctlError(f"{STDIN_NAME}: the spec is not UTF-8 text (byte {exc.start})", hint=hint) from None


def read_secret_file(path: Path) -> str | None:
    """The secret in a file (trailing newline dropped); None when missing or empty. Like ssh with a private key,
    a file that group or others may read or write is refused, and so is anything but a small regular file."""
    fix = f"keep the secret alone in a regular file of at most {SECRET_FILE_LIMIT} bytes, mode 0600"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretUnusable(f"cannot be read: {exc.strerror}", fix) from None
    except ValueError:  # a NUL byte in the path (reported as a control character too)
        raise SecretUnusable("is not a usable path (it holds a NUL byte)", fix) from None
    if stat.S_ISREG(mode) and mode & 0o077:
        raise SecretUnusable(f"is open to group or others (mode {stat.S_IMODE(mode):04o})", f"chmod 600 {path}")
    try:
        text = read_bounded(path, fix, limit=SECRET_FILE_LIMIT, follow=True)
    except FileProblem as exc:
        raise SecretUnusable(exc.summary.removeprefix(f"{path}: "), fix) from None
    return (text or "").rstrip("\r\n") or None
