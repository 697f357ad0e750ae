"""-f DIR on audit, backup and inventory without servers: the options of one topology refused by name before anything
is read or written, inventory's summary (the provider: local topologies left out and said), the audit's line and the
worst exit code of the fleet, backup's JSON entry (the single backup's backup-done event)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.audit.survey import AuditReport
from opsctl.backup.save import BackupDone
from opsctl.base.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK
from opsctl.cli.commands.fleetrun import worst_exit
from opsctl.cli.results import Audited, Backed
from opsctl.fleet.summary import FleetResult, Outcome, result_line
from opsctl.observe.findings import Finding
from opsctl.state.standbyfiles import StandbyStatus
from opsctl.status.looks import StatusResult
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def fleet(tmp_path: Path, ansible: tuple[str, ...] = ()) -> Path:
    """A folder of two standalone topologies, a-one and b-two; those named in ansible are provider: ansible."""
    folder = tmp_path / "fleet"
    folder.mkdir()
    for name in ("a-one", "b-two"):
        spec = make_spec("standalone", hosts=1)
        hosts = [{**host, "name": f"{name}-{host['name']}"} for host in spec["hosts"]]
        provider = {"provider": "ansible"} if name in ansible else {}
        write_spec(folder, {**spec, "name": name, "hosts": hosts, **provider}, f"{name}.yaml")
    return folder


@pytest.mark.parametrize(("argv", "said"), [
    (["audit", "--hot"], "--hot goes with one topology (-f SPEC), not with audit -f DIR"),
    (["audit", "--metrics-textfile", "{tmp}"], "--metrics-textfile goes with one topology"),
    (["audit", "--output", "html"], "--output html is one topology's page"),
    (["audit", "--state-dir", "{tmp}"], "--state-dir is for one spec"),
    (["backup", "--to", "{tmp}/bk", "--continuous"], "--continuous goes with one topology (-f SPEC)"),
    (["backup", "--to", "{tmp}/bk", "--metrics-textfile", "{tmp}"], "--metrics-textfile goes with one topology"),
    (["backup", "--to", "{tmp}/bk", "--only", "nope"], "no topology named nope"),
])
def test_options_of_one_topology_are_refused_with_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           argv: list[str], said: str) -> None:
    folder = fleet(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, argv[0], "-f", str(folder), *argv[1:])
    assert code == 1 and out == "" and said in err and "Traceback" not in err, err
    assert not (tmp_path / "bk").exists()  # refused before anything was written


def test_inventory_of_a_folder_leaves_the_local_topologies_out(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = fleet(tmp_path, ansible=("b-two",))
    code, out, err = run(capsys, "inventory", "-f", str(folder), "--dir", str(tmp_path / "inv"), "--offline")
    assert code == 0, err
    assert "left out (provider: local, no inventory): a-one" in err
    assert out.splitlines() == [f"b-two  wrote {tmp_path / 'inv' / 'b-two.yml'}", "inventory: 1 topology"]
    assert sorted(p.name for p in (tmp_path / "inv").iterdir()) == ["b-two.yml"]
    code, out, err = run(capsys, "inventory", "-f", str(folder), "--offline", "--output", "json")
    assert code == 0, err
    result = json.loads(out)
    assert [t["name"] for t in result["topologies"]] == ["b-two"] and not result["failed"]
    assert "b-two-1" in json.dumps(result["topologies"][0]["_meta"])  # the inventory, as the single -o json gives
    assert PASSWORD not in out


def test_inventory_of_a_folder_without_ansible_topologies_is_refused(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inventory", "-f", str(fleet(tmp_path)), "--dir", str(tmp_path / "inv"))
    assert code == 1 and out == "" and "no provider: ansible topology among a-one, b-two" in err
    assert not (tmp_path / "inv").exists()


def finding(rule: str, severity: str, node: str = "a-1") -> Finding:
    return Finding(rule, severity, node, "message", "fix")


def audited(*findings: Finding, fail_on: str = "low") -> Audited:
    return Audited(AuditReport("a", ("config",), list(findings)), fail_on)


def test_an_audit_line_counts_findings_by_severity_and_names_unread_nodes() -> None:
    assert audited().text() == "0 findings"
    two = audited(finding("scan-target", "medium"), finding("scan-target", "info"), finding("scan-target", "medium"))
    assert two.text() == "3 findings (2 medium, 1 info)" and two.code == EXIT_FINDINGS
    assert audited(finding("scan-target", "info")).code == EXIT_OK
    unread = audited(finding("reachable", "high", "a-2"))
    assert unread.text().endswith("could not read a-2: incomplete") and unread.code == EXIT_ERROR


def test_the_fleet_exit_is_the_worst_a_single_command_gives() -> None:
    def exit_of(*outcomes: Outcome[Audited]) -> int:
        return worst_exit(FleetResult("audit", outcomes), lambda a: a.code)

    clean, findings = audited(), audited(finding("scan-target", "medium"))
    assert exit_of(Outcome("a", clean), Outcome("b", clean)) == EXIT_OK
    assert exit_of(Outcome("a", clean), Outcome("b", findings)) == EXIT_FINDINGS
    assert exit_of(Outcome("a", findings), Outcome("b", None, "down")) == EXIT_ERROR  # a failure beats findings


def test_a_backup_entry_is_the_single_backup_s_result_event() -> None:
    done = BackupDone("/b/a/a-1", 3, 100, 0.5)
    entry = Outcome("a", Backed("/b/a/a-1", None, done)).to_dict()  # type: ignore[arg-type]
    assert entry == {"name": "a", "event": "backup-done", "dir": "/b/a/a-1", "keys": 3, "bytes": 100, "seconds": 0.5}


def test_a_standbys_status_line_names_its_link() -> None:
    link = StandbyStatus("switched-over", "shop-east", mode="planned", switched_at=0.0)
    healthy = StatusResult("shop", "standalone", True, "standalone healthy", (), None)
    assert result_line(healthy) == "standalone healthy"
    assert result_line(replace(healthy, standby=link)) == f"standalone healthy; {link.line()}"
    assert "switched over from shop-east (planned" in result_line(replace(healthy, standby=link))
