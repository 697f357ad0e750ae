"""Scale a cluster through the spec (masters 3 -> 4 -> 3) with a concurrent writer, on Valkey 9.1 and Redis 7.0."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.cli.main import main
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, PASSWORD_ENV, NodeClient, admin_for, cluster_check
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_scale_out_then_in_loses_nothing(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        try:
            preload(loaded, 4000)
            client = cluster_client(loaded)
            before = dataset_checksum(client, "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}}))
                plan = plan_json(capsys, spec)
                moves = [s for s in plan["steps"] if s["kind"] == "move-slots"]
                assert {m["target"] for m in moves} == {f"{loaded.spec.name}-7"}
                assert sum(m["slot_count"] for m in moves) == 4096 and all(m["est_keys"] > 0 for m in moves)
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []

                spec.write_text(yaml.safe_dump(data))
                plan = plan_json(capsys, spec)
                kinds = [s["kind"] for s in plan["steps"]]
                assert kinds == ["move-slots"] * 3 + ["remove-node"] * 2 + ["wait-converged"], kinds
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "3 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            kept_everything(spec, writer, before, "3 masters")
        finally:  # also stop the fourth shard's nodes if the test failed half way
            spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}}))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()



def test_a_scale_with_a_restart_only_change_fails_over_each_master_first_and_loses_nothing(tmp_path, capsys) -> None:
    """One apply adds a shard and changes io-threads (a restart: a failover before each master's), one removes it
    and changes it back. The plan fails every master over before it starts and joins the new nodes (or drains and
    removes the old ones); the failover's pre-checks took the spec's servers for the cluster's, and the first one
    timed out: 'cluster-agrees: t-7: unreachable; t-8: unreachable', and in a scale-in 't-1: knows ... (t-7),
    which is not an observed node'."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        grown = {**data, "cluster": {**data["cluster"], "masters": 4}, "config": {"io-threads": 2}}
        try:
            preload(loaded, 2000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                for target, masters in ((grown, "4 masters"), (data, "3 masters")):
                    writer.wait_for_writes(len(writer.acked) + 100)
                    spec.write_text(yaml.safe_dump(target))
                    kinds = {s["kind"] for s in plan_json(capsys, spec)["steps"]}
                    assert {"failover", "move-slots"} <= kinds, kinds
                    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                    assert code == 0 and masters in out, err + out
                    assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            kept_everything(spec, writer, before, "3 masters")
        finally:  # also stop the fourth shard's nodes if the test failed half way
            spec.write_text(yaml.safe_dump(grown))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()


def open_slots_of(admin: NodeClient) -> list[str]:
    """The node's own open slots as CLUSTER NODES lists them ('[slot->-id]', '[slot-<-id]')."""
    myself = next(line for line in str(admin.call("CLUSTER", "NODES")).splitlines() if "myself" in line)
    return [field for field in myself.split()[8:] if field.startswith("[")]


def killed_mid_move(spec: Path, loaded: LoadedSpec) -> None:
    """Apply the spec and SIGKILL opsctl as soon as one of loaded's shard masters shows a slot open (its move's
    first wave, journaled)."""
    with contextlib.ExitStack() as stack:
        admins = [stack.enter_context(admin_for(loaded, loaded.layout.node(s.master)))
                  for s in loaded.layout.shards]
        proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
                                env={**os.environ, PASSWORD_ENV: PASSWORD}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not any(map(open_slots_of, admins)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert any(map(open_slots_of, admins)), "apply was not killed while a slot was open"


def killed_then_applied_again(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec, changed: dict,
                              again: dict, masters: int) -> tuple[dict, str]:
    """Preload, apply `changed` under a writer and SIGKILL it mid-move (killed_mid_move), then apply `again` once:
    exit 0 with `masters` masters, the plan after it empty, no acknowledged write lost, the preloaded keys'
    checksum kept, redis-cli --cluster check OK. Returns the plan made right after the kill and the check's
    output."""
    preload(loaded, 30000)
    before = dataset_checksum(cluster_client(loaded), "pre:*")
    with Writer(lambda: cluster_client(read_spec(spec))) as writer:
        writer.wait_for_writes(100)
        spec.write_text(yaml.safe_dump(changed))
        killed_mid_move(spec, loaded)
        spec.write_text(yaml.safe_dump(again))
        plan = plan_json(capsys, spec)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and f"{masters} masters" in out, err + out
        assert plan_json(capsys, spec)["steps"] == []
        writer.wait_for_writes(len(writer.acked) + 100)
    return plan, kept_everything(spec, writer, before, f"{masters} masters")


def kept_everything(spec: Path, writer: Writer, before: tuple[int, str], masters: str) -> str:
    """No acknowledged write lost, the preloaded keys' checksum as before, and redis-cli --cluster check OK with
    `masters` ('3 masters'); returns the check's output."""
    client = cluster_client(read_spec(spec))
    assert writer.verify(client) == []
    assert dataset_checksum(client, "pre:*") == before
    check = cluster_check(read_spec(spec).layout.servers[0].endpoint)
    assert check.returncode == 0 and masters in check.stdout, check.stdout
    return check.stdout


def test_a_scale_out_killed_mid_move_then_a_restart_only_change_repairs_the_slots_first(tmp_path, capsys) -> None:
    """An apply adding a shard is killed while its first move into the new master has slots open, then one apply
    also changes io-threads. It failed every master over before the slot repair, and the first failover timed out
    after 60 s ('no-open-slots: t-1:4096, ...'); with the repair first, closing gave the new master (empty when
    planned, so restarted as a replica would be) its slots and its restart was refused ('t-7 takes shard 4's
    writes now'). The repair runs alone; apply then plans the rest from what the nodes say."""
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        grown = {**data, "cluster": {**data["cluster"], "masters": 4}}
        try:
            plan, _ = killed_then_applied_again(capsys, spec, loaded, grown, {**grown, "config": {"io-threads": 2}}, 4)
            assert [s["kind"] for s in plan["steps"]] == ["close-slots"] and plan["replan"], plan
        finally:  # the grown spec: the fourth shard's nodes are stopped too
            spec.write_text(yaml.safe_dump(grown))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()


def test_a_scale_out_killed_mid_move_is_finished_by_the_same_apply(tmp_path, capsys) -> None:
    """An apply adding a shard is killed while its first move into the new master has slots open, then the same
    spec is applied again. The moves went only into masters holding no slot: closing the open wave gave the new
    master its 16 slots, the others kept ~5450 each, and the plan after was empty. The fill is journaled before
    the first move: the close runs alone, then apply moves the rest of the new shard's share."""
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        grown = {**data, "cluster": {**data["cluster"], "masters": 4}}
        try:
            plan, check = killed_then_applied_again(capsys, spec, loaded, grown, grown, 4)
            assert [s["kind"] for s in plan["steps"]] == ["close-slots"] and plan["replan"], plan
            assert "scale-out" in plan["notes"][0], plan
            shares = [int(n) for n in re.findall(r"\| (\d+) slots \|", check)]
            assert len(shares) == 4 and all(abs(n - 4096) <= 1 for n in shares), check  # balance_moves'
        finally:  # the grown spec: the fourth shard's nodes are stopped too
            spec.write_text(yaml.safe_dump(grown))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()


def test_a_scale_in_killed_mid_drain_is_finished_by_the_same_apply(tmp_path, capsys) -> None:
    """An apply removing a shard is killed while its drain has slots open, then the same spec is applied again.
    The plan closed the open wave and planned nothing more (the moves are planned once nothing is open) but a wait,
    which failed: it judged the spec's servers only, whose views know the leaving shard ('knows ..., which is not
    an observed node'). Now the wait judges the cluster as it is (the retired nodes it still knows), and a plan
    that closes slots is followed by another: the drain, the removal, then the wait."""
    with deployed(tmp_path, capsys, "cluster", "redis", cluster={"masters": 4}) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        shrunk = {**data, "cluster": {**data["cluster"], "masters": 3}}
        try:
            plan, _ = killed_then_applied_again(capsys, spec, loaded, shrunk, shrunk, 3)
            assert plan["steps"][0]["kind"] == "close-slots" and plan["replan"], plan
        finally:  # the whole spec: the fourth shard's nodes are stopped too
            spec.write_text(yaml.safe_dump(data))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            capsys.readouterr()
