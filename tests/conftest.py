from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import PASSWORD, PASSWORD_ENV

TEST_ROOT = Path(tempfile.gettempdir()) / "opsctl-tests"


@pytest.fixture(autouse=True)
def _test_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    # boto's credential chain would ask the EC2 metadata address (169.254.169.254) over the network from a unit test
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    config.addinivalue_line("markers", "second_flavor: a heavy live test's run on its second flavor, where the "
                            "flavor is not what it tests: left out of `make test`, `make partitions` runs it")


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh folder per test that the servers' unprivileged user can pass through (run as root, the local
    provider starts servers as that user). pytest's own tmp_path lives under /tmp/pytest-of-<user>, which
    every pytest session resets to 0700, so the tests' folders live under /tmp/opsctl-tests/ (0711) instead."""
    TEST_ROOT.mkdir(mode=0o711, exist_ok=True)
    if TEST_ROOT.stat().st_uid == os.geteuid():
        TEST_ROOT.chmod(0o711)
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:40]
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=TEST_ROOT))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# The split between unit and live tests (`make test-fast` runs only the unit ones). A test without one of these
# markers may not start a server binary or connect to a server that this process did not open. Checked at the two
# doors every live test goes through, for unmarked tests only (the marked ones pay nothing):
# - every process start goes through Popen._execute_child (run, check_output, call and the providers' Popen too),
#   so a server binary named anywhere in argv (setpriv/sudo wrappers included) is caught;
# - every socket connect (redis-py, the raw pipes, socket.create_connection, unix sockets) goes through
#   socket.socket.connect; a connect that succeeds to an address no socket of this process listens on is a real
#   server. Fakes served from the test's own threads (listening here) stay unit tests; a refused connect costs
#   nothing. (Marking by file would be cheaper still but goes stale: a live test added to a unit file slips by.)
# Violations are recorded and fail the test at teardown, so code that swallows OSError cannot hide them.
LIVE_MARKERS = frozenset({"integration", "remote", "soak", "second_flavor"})
SERVER_BINARIES = frozenset({
    "redis-server", "valkey-server", "redis-sentinel", "valkey-sentinel", "redis-cli", "valkey-cli", "sshd",
    "prometheus", "prometheus-redis-exporter", "prometheus-node-exporter", "redis_exporter", "node_exporter",
    "opsctl-node",  # the hosts' control script (playbooks/files/opsctl-node.sh): it starts and stops servers
})
# Asking a binary its version starts no server (the providers probe the flavor and version that way).
PROBES = frozenset({"--version", "-v"})


def _server_binary(args: object) -> str | None:
    words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args) if args is not None else []
    if any(isinstance(word, str) and word in PROBES for word in words):
        return None
    for word in words:
        name = os.path.basename(os.fsdecode(word)) if isinstance(word, (str, bytes, os.PathLike)) else ""
        if name in SERVER_BINARIES:
            return name
    return None


@pytest.fixture(autouse=True)
def _unit_tests_stay_off_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    if any(request.node.get_closest_marker(name) for name in LIVE_MARKERS):
        yield
        return
    violations: list[str] = []
    listening: set[object] = set()
    real_listen, real_connect, real_connect_ex = socket.socket.listen, socket.socket.connect, socket.socket.connect_ex
    real_execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def key(sock: socket.socket, address: object) -> object:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            return ("port", address[1])
        return ("path", address)

    def listen(self: socket.socket, *backlog: int) -> None:
        real_listen(self, *backlog)
        with contextlib.suppress(OSError):
            listening.add(key(self, self.getsockname()))

    def check(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX) and key(self, address) not in listening:
            violations.append(f"connected to a server at {address!r}")

    def connect(self: socket.socket, address: object) -> None:
        real_connect(self, address)
        check(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        code = real_connect_ex(self, address)
        if code == 0:
            check(self, address)
        return code

    def execute_child(self: subprocess.Popen[Any], args: object, *rest: Any, **kwargs: Any) -> None:
        name = _server_binary(args)
        if name is not None:
            violations.append(f"started {name}")
        real_execute(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "listen", listen)
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(subprocess.Popen, "_execute_child", execute_child)
        yield
    if violations:
        pytest.fail(f"{request.node.nodeid} has no integration/remote/soak marker but "
                    f"{'; '.join(sorted(set(violations))[:3])}: mark it integration (make test-fast runs unit tests)",
                    pytrace=False)
