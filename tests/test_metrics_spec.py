"""metrics: {exporter: true, port_offset: N} (issue 24, item 1): an exporter port that cannot be bound is a located
spec error on metrics.port_offset; metrics targets lists the ports the offset gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.state.specfile import read_spec
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def test_an_exporter_on_a_cluster_bus_port_is_a_located_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("cluster", metrics={"exporter": True, "port_offset": 10000}))
    code, out, err = run(capsys, "validate", "-f", str(spec))
    assert code == 1 and out == "", err
    assert "metrics.port_offset" in err and "cluster bus port" in err and "more)" in err, err
    assert "topology.yaml:" in err and "Traceback" not in err, err


def test_the_plaintext_port_counts_when_tls_has_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("standalone", metrics={"exporter": True},
                                          tls={"enabled": True, "generate": True, "plaintext_port": True}))
    code, _, err = run(capsys, "validate", "-f", str(spec), "--no-secrets")
    assert code == 1 and "plaintext port" in err and "metrics.port_offset" in err, err


def test_without_exporters_the_offset_is_not_checked_and_targets_follow_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_spec("standalone", metrics={"port_offset": 10000}))
    assert run(capsys, "validate", "-f", str(spec))[0] == 0
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec))
    assert code == 0, err
    port = json.loads(out)[0]["targets"][0].rsplit(":", 1)[1]
    assert int(port) == read_spec(spec).layout.servers[0].port + 10000
