from __future__ import annotations

import os

import pytest

from tests.support import PASSWORD, PASSWORD_ENV


@pytest.fixture(autouse=True)
def _test_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
