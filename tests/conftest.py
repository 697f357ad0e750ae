from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import PASSWORD, PASSWORD_ENV

TEST_ROOT = Path(tempfile.gettempdir()) / "opsctl-tests"


@pytest.fixture(autouse=True)
def _test_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)


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
