"""audit exits 1 when it could not read a node, as the README's exit codes say (issue 25, defect 5): an incomplete
report is an error, not findings (4). Nothing runs here: every node of the spec is down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.mark.parametrize("output", ["table", "json"])
def test_audit_of_unreachable_nodes_exits_1_after_its_report(tmp_path: Path, output: str,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1))
    code, out, err = run(capsys, "audit", "-f", str(spec), "config", "--output", output)
    assert code == 1, err
    assert "the audit could not read 1 node" in err and "Traceback" not in err
    if output == "json":
        assert json.loads(out)["findings"][0]["rule"] == "reachable"  # the report still prints, whole
    else:
        assert "does not answer" in out
