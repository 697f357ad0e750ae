"""opsctl apply/plan/status/destroy on the local provider, every topology, Valkey 9.1 and Redis 7.0."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import redis

from opsctl.cli.main import main
from opsctl.providers.proc import read_proc
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, admin_for, cluster_check, make_spec, write_spec

pytestmark = pytest.mark.integration
FLAVORS = ["valkey", "redis"]
TOPOLOGIES = ["standalone", "replication", "sentinel", "cluster"]


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_apply_converges_and_a_second_apply_changes_nothing(tmp_path, capsys, topology, flavor) -> None:
    with deployed(tmp_path, capsys, topology, flavor) as (spec, loaded):
        code, out, _err = run(capsys, "status", "-f", str(spec), "--output", "json")
        status = json.loads(out)
        assert code == 0 and status["healthy"], status["health"]
        assert all(n["state"] == "up" for n in status["nodes"])
        plan = plan_json(capsys, spec)
        assert plan["steps"] == [] and "nothing to do" in plan["notes"][0]
        code, out, _ = run(capsys, "plan", "-f", str(spec))
        assert code == 0 and "no changes" in out
        if topology == "cluster":
            check = cluster_check(loaded.layout.servers[0].endpoint)
            assert check.returncode == 0, check.stdout + check.stderr
            assert "All 16384 slots covered" in check.stdout
        for node in loaded.layout.servers:
            with admin_for(loaded, node) as admin:
                assert admin.config_get("maxmemory")["maxmemory"] == str(64 * 1024 * 1024)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_killed_node_is_restarted_by_the_next_apply(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        victim = loaded.layout.shards[1].replicas[0]
        pidfile = Path(tmp_path / ".opsctl" / loaded.spec.name / victim / "server.pid")
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        plan = plan_json(capsys, spec)
        assert next((s["kind"], s["node"]) for s in plan["steps"]) == ("start", victim)
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err
        assert plan_json(capsys, spec)["steps"] == []
        assert cluster_check(loaded.layout.servers[0].endpoint).returncode == 0


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_live_settable_change_is_applied_without_restart(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "replication", flavor) as (spec, loaded):
        pids = {n.name: _pid(tmp_path, loaded.spec.name, n.name) for n in loaded.layout.servers}
        data = make_spec("replication")  # only for its shape; edit the deployed spec in place
        text = spec.read_text().replace("maxmemory: 64mb", "maxmemory: 96mb")
        assert text != spec.read_text() and data
        spec.write_text(text)
        plan = plan_json(capsys, spec)
        assert {s["kind"] for s in plan["steps"]} == {"write-config", "config-set", "wait-converged"}
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err
        for node in loaded.layout.servers:
            assert _pid(tmp_path, loaded.spec.name, node.name) == pids[node.name]
            with admin_for(loaded, node) as admin:
                assert admin.config_get("maxmemory")["maxmemory"] == str(96 * 1024 * 1024)
            conf = (tmp_path / ".opsctl" / loaded.spec.name / node.name / "redis.conf").read_text()
            assert "maxmemory 96mb" in conf
        assert plan_json(capsys, spec)["steps"] == []


def _pid(tmp_path: Path, name: str, node: str) -> int:
    return int((tmp_path / ".opsctl" / name / node / "server.pid").read_text())


def test_a_bad_spec_changes_nothing(tmp_path, capsys) -> None:
    spec = make_spec("cluster")
    spec["memory"]["policy"] = "volatile-lr"
    path = write_spec(tmp_path, spec)
    code, _, err = run(capsys, "apply", "-f", str(path), "--auto-approve")
    assert code == 1
    assert "did you mean 'volatile-lru'" in err and "Traceback" not in err
    assert not (tmp_path / ".opsctl").exists()


def test_a_wrong_secret_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch) -> None:
    path = write_spec(tmp_path, make_spec("standalone"))
    monkeypatch.delenv("OPSCTL_TEST_PASSWORD")
    code, _, err = run(capsys, "apply", "-f", str(path), "--auto-approve")
    assert code == 1 and "secret not found" in err
    assert not (tmp_path / ".opsctl").exists()


def test_apply_without_a_terminal_needs_auto_approve(tmp_path, capsys, monkeypatch) -> None:
    path = write_spec(tmp_path, make_spec("standalone"))
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115
    code, _, err = run(capsys, "apply", "-f", str(path))
    assert code == 1 and "--auto-approve" in err
    main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def test_a_saved_plan_is_refused_once_the_live_state_moved(tmp_path, capsys) -> None:
    path = write_spec(tmp_path, make_spec("standalone"))
    saved = tmp_path / "plan.json"
    try:
        code, _, _ = run(capsys, "plan", "-f", str(path), "--out", str(saved))
        assert code == 2
        code, _, err = run(capsys, "apply", "-f", str(path), "--auto-approve", "--plan", str(saved))
        assert code == 0, err
        code, _, err = run(capsys, "apply", "-f", str(path), "--auto-approve", "--plan", str(saved))
        assert code == 3 and "changed since the plan was made" in err
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def test_no_secret_in_plan_status_or_state(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, _):
        outputs = [run(capsys, cmd, "-f", str(spec), "--output", "json")[1] for cmd in ("plan", "status")]
        records = [p.read_text() for p in (tmp_path / ".opsctl").rglob("opsctl-node.json")]
        for text in outputs + records:
            assert PASSWORD not in text


def test_destroy_keeps_data_unless_purged(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        node = loaded.layout.servers[0]
        with admin_for(loaded, node) as admin:
            admin.client.set("orders:1", "kept")
        assert run(capsys, "destroy", "-f", str(spec), "--auto-approve")[0] == 0
        # every server stopped, which the provider sees: nothing runs to be split, so no --force-lock (issue 33)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and "--force-lock" not in err, err + out
        with admin_for(loaded, node) as admin:
            assert admin.client.get("orders:1") == "kept"
        with pytest.raises(redis.ConnectionError):
            main(["destroy", "-f", str(spec), "--auto-approve"])
            capsys.readouterr()
            admin_for(loaded, node, timeout=0.5).client.ping()


def test_a_change_that_needs_a_restart_refuses_masters_without_allow_downtime(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "standalone", "redis") as (spec, loaded):
        spec.write_text(spec.read_text().replace("OPS_CONFIG_T3ST", "OPS_CONFIG_N3W1"))
        plan = plan_json(capsys, spec)
        assert [s["kind"] for s in plan["steps"]] == ["write-config", "restart"]
        assert plan["steps"][1]["needs_downtime"] and "rename-command" in plan["steps"][1]["reason"]
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "--allow-downtime" in err
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", "--allow-downtime")
        assert code == 0, err
        node = loaded.layout.servers[0]
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)
        assert client.execute_command("OPS_CONFIG_N3W1", "GET", "port")
        with pytest.raises(redis.ResponseError):
            client.execute_command("OPS_CONFIG_T3ST", "GET", "port")
        assert plan_json(capsys, spec)["steps"] == []


def test_a_wrong_password_is_a_clear_error_and_changes_nothing(tmp_path, capsys, monkeypatch) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, _):
        monkeypatch.setenv("OPSCTL_TEST_PASSWORD", "another-password-0123456789")
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 1 and "authentication failed for" in err and "auth.password" in err
        assert "another-password-0123456789" not in err and "Traceback" not in err
        code, out, err = run(capsys, "status", "-f", str(spec))  # issue 14 case 7: not "down", and not exit 0
        assert code == 1 and "authentication failed for" in out and "down" not in out.splitlines()[-1]
        assert "hint:" in err and "auth.password" in err
        monkeypatch.setenv("OPSCTL_TEST_PASSWORD", PASSWORD)
        assert plan_json(capsys, spec)["steps"] == []


def test_a_deleted_pidfile_neither_hides_a_server_nor_lets_purge_delete_under_it(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        node = loaded.layout.servers[0]
        folder = tmp_path / ".opsctl" / loaded.spec.name / node.name
        pid = int((folder / "server.pid").read_text())
        (folder / "server.pid").unlink()
        code, out, err = run(capsys, "status", "-f", str(spec))
        assert code == 0 and "standalone ok" in out, out + err
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0, err
        assert read_proc(pid) is None and not folder.exists()  # stopped first (gone or a zombie), then purged
