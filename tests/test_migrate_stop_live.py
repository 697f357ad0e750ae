"""`opsctl migrate` off a terminal waiting for its cutover (issue 33 item 8): a heartbeat line every few seconds
(each shard's phase and lag) instead of silence; SIGTERM pauses it with a closing line, not `error:`, and keeps
143: its exit 0 means cut over, which a pause is not. A standalone source into a standalone target per flavor."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.base.poll import wait_for
from tests.support import CONDITION_BOUND, PASSWORD
from tests.test_migrate_live import pair

pytestmark = pytest.mark.integration

STREAMING = re.compile(r"^\S+: lag \S+ \d+\.\d\ds, \d+ applied$", re.M)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_migrate_beats_off_a_terminal_and_a_sigterm_is_a_pause(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               flavor: str) -> None:
    side = ("standalone", flavor, {"hosts": 1})
    with pair(tmp_path, capsys, side, side) as (source, _, target, _):
        err = tmp_path / "migrate.err"
        argv = [sys.executable, "-m", "opsctl.cli.main", "migrate", "-f", str(target), "--from", str(source),
                "--cutover", "manual", "--auto-approve"]
        with err.open("wb") as stderr:  # a file: no terminal, as in CI
            migrate = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for(lambda: STREAMING.search(err.read_text()), CONDITION_BOUND,
                     "a heartbeat of the streaming migration", 0.1,
                     last_reason=err.read_text)
        finally:
            migrate.send_signal(signal.SIGTERM)
            code = migrate.wait(60)
        text = err.read_text()
        assert code == 128 + signal.SIGTERM, text
        assert text.splitlines()[-1].startswith("the migration stopped on SIGTERM before its cutover: it is "
                                                "journaled, run the same command to go on"), text
        assert "error:" not in text and "Traceback" not in text and "\x1b" not in text and PASSWORD not in text
