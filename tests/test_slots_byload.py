"""`opsctl cluster rebalance --by cpu|network|memory|keys` on real servers under a skewed load: Valkey 9.1 measures
per slot (CLUSTER SLOT-STATS, cluster.slot_stats on), Redis 7.0 is sampled (keys, memory; cpu refused by name).
Judged by a writer recording acknowledged writes, a checksum of the preloaded keys and redis-cli --cluster check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.base.poll import wait_for
from opsctl.slots.journal import JOURNAL
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.skewload import SkewLoad, slots_of, tags_by_slot
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, admin_for
from tests.test_slots_reshard import master_slots, preload, referee_ok
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration

WRITER_PACE = 0.01  # seconds between acknowledged writes: the writer referees data, the skewed load sets the load


def rebalance(capsys: pytest.CaptureFixture[str], spec: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "cluster", "rebalance", "-f", str(spec), "--output", "json", *extra)
    return code, (json.loads(out) if code == 0 else {}), err


def pile_keys(client: Any, tags: dict[int, str], slots: list[int], per_slot: int) -> None:
    """per_slot keys in each of slots (their hash tags): a master heavy in keys and memory."""
    for slot in slots:
        pipe = client.pipeline()
        for i in range(per_slot):
            pipe.set(f"{tags[slot]}:{i}", "v" * 100)
        pipe.execute()


def hot_keys(tags: dict[int, str], slots: list[int]) -> list[str]:
    return [f"{tags[s]}:hot{i}" for s in slots for i in range(3)]


def first_master(loaded: LoadedSpec) -> str:
    return loaded.layout.node(loaded.layout.shards[0].master).endpoint


def process_id(loaded: LoadedSpec, node: Any) -> str:
    with admin_for(loaded, node) as admin:
        return next(line for line in admin.info("server").splitlines() if line.startswith("process_id:"))


def turn_slot_stats_on(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec) -> None:
    """--by cpu is refused while the counters are off; cluster.slot_stats and apply turn them on, live."""
    code, _out, err = run(capsys, "cluster", "rebalance", "-f", str(spec), "--by", "cpu", "--dry-run")
    assert code == 1 and "cluster-slot-stats-enabled is off" in err and "slot_stats: true" in err, err
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "slot_stats": True}}))
    pids = {n.name: process_id(loaded, n) for n in loaded.layout.servers}
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0, err + out
    assert plan_json(capsys, spec)["steps"] == []
    for node in loaded.layout.servers:
        with admin_for(loaded, node) as admin:
            assert admin.config_get("cluster-slot-stats-enabled")["cluster-slot-stats-enabled"] == "yes"
        assert process_id(loaded, node) == pids[node.name]  # set live, no restart


def test_valkey_by_cpu_network_keys_with_a_hot_slot_and_a_dry_run(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey", memory={"policy": "allkeys-lfu"}) as (spec, loaded):
        turn_slot_stats_on(capsys, spec, loaded)
        preload(loaded, 3000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        tags = tags_by_slot(client)
        mine = slots_of(client, first_master(loaded), tags)
        pile_keys(client, tags, mine[:30], 100)  # keys: the first master holds ~2x the others
        cold = [f"cold:{i}" for i in range(3000)]  # the load's own keys: the preloaded ones keep their values
        slot_map = master_slots(spec, capsys)

        # keys: a dry run plans and moves nothing
        code, result, err = rebalance(capsys, spec, "--by", "keys", "--dry-run")
        assert code == 0, err
        plan = result["plan"]
        assert result["dry_run"] and plan["by"] == "keys" and "SLOT-STATS" in plan["measured"]
        assert plan["spread_now"] > 1.5 and plan["spread_after"] <= 1.1 and plan["slot_moves"], plan
        assert {m["source"] for m in plan["slot_moves"]} == {loaded.layout.shards[0].master}
        assert master_slots(spec, capsys) == slot_map

        # network: one slot takes most of the load: named with its top keys, left alone
        lone = slots_of(client, loaded.layout.node(loaded.layout.shards[1].master).endpoint, tags)[7]
        with SkewLoad(client, hot_keys(tags, [lone]), cold, 0.85) as load:
            code, result, err = rebalance(capsys, spec, "--by", "network", "--window", "1", "--dry-run")
            hot_code, hot_out, hot_err = run(capsys, "audit", "-f", str(spec), "--hot", "--hot-window", "1",
                                             "--top", "3", "--output", "json", "--metrics-textfile", str(tmp_path))
        assert code == 0 and load.ops > 100, err
        # audit --hot: the lone slot first on its master, its keys ranked by access frequency (LFU)
        assert hot_code == 0, hot_err
        report = json.loads(hot_out)
        assert report["by"] == "cpu"
        on_b = next(m for m in report["masters"] if m["master"] == loaded.layout.shards[1].master)
        assert on_b["slots"][0]["slot"] == lone and len(on_b["slots"]) <= 3
        assert set(on_b["slots"][0]["top_keys"][:3]) == set(hot_keys(tags, [lone]))
        textfile = (tmp_path / f"opsctl_{loaded.spec.name}_audit_hot.prom").read_text()
        assert (f'opsctl_slot_load_share{{topology="{loaded.spec.name}",master="{on_b["master"]}",slot="{lone}",'
                'by="cpu"}') in textfile
        plan = result["plan"]
        assert [h["slot"] for h in plan["hot"]] == [lone], plan["hot"]
        named = plan["hot"][0]["top_keys"]
        assert set(hot_keys(tags, [lone])) <= set(named) and all(client.keyslot(k) == lone for k in named)
        assert lone not in [m["slot"] for m in plan["slot_moves"]]
        assert any(f"slot {lone}" in note and "left where it is" in note for note in result["notes"])

        # cpu: 85% of the operations on 6 slots of the first master, moved for real under a writer. The writer is
        # paced: two unpaced threads share the GIL at rates the machine's load decides, and an even writer as fast
        # as the skewed load halves the skew the test sets (a loaded CI measured 1.47x, not the > 1.5x premised)
        hot = mine[40:46]
        with (Writer(lambda: cluster_client(loaded), pause=WRITER_PACE) as writer,
              SkewLoad(client, hot_keys(tags, hot), cold) as load):
            writer.wait_for_writes(100)
            wait_for(lambda: load.ops > 4 * len(writer.acked) or None, CONDITION_BOUND,
                     "the skewed load well ahead of the paced writer")
            code, result, err = rebalance(capsys, spec, "--by", "cpu", "--window", "1", "--auto-approve")
            assert code == 0, err
            writer.wait_for_writes(len(writer.acked) + 100)
        plan = result["plan"]
        # the spread as whole slots allow (reached or not: six hot slots cut coarsely under a loaded CI)
        assert plan["spread_now"] > 1.5 and plan["spread_after"] < plan["spread_now"] / 1.5, plan
        moved = [m["slot"] for m in plan["slot_moves"]]
        assert set(moved) & set(hot) and len(moved) == len(set(moved))
        assert result["summary"]["slots_done"] == len(moved)
        assert writer.verify(client) == []
        assert dataset_checksum(client, "pre:*") == before
        referee_ok(loaded)


def test_redis_by_keys_and_memory_sampled_cpu_refused_and_a_kill_resumed(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        preload(loaded, 3000)
        client = cluster_client(loaded)
        tags = tags_by_slot(client)
        mine = slots_of(client, first_master(loaded), tags)
        pile_keys(client, tags, mine[:40], 150)
        before = dataset_checksum(client, "pre:*"), dataset_checksum(client, "{t*")

        code, out, err = run(capsys, "audit", "-f", str(spec), "--hot", "--hot-window", "0.5", "--top", "2")
        assert code == 0 and "Hottest slots by keys" in out, err + out
        first = out.splitlines()[2].split(":")[0].strip()  # the first master's hottest slot: one with piled keys
        assert first in {f"slot {s}" for s in mine[:40]}, out
        assert "hottest keys" not in out  # allkeys-lru: no access frequency to rank keys by

        for by in ("cpu", "network"):
            code, _out, err = run(capsys, "cluster", "rebalance", "-f", str(spec), "--by", by, "--dry-run")
            assert code == 1 and f"--by {by} needs per-slot statistics" in err and "redis 7.0" in err, err
            assert "Traceback" not in err

        slot_map = master_slots(spec, capsys)
        code, result, err = rebalance(capsys, spec, "--by", "memory", "--dry-run")
        assert code == 0, err
        plan = result["plan"]
        assert "estimated" in plan["measured"] and plan["spread_now"] > 1.5 and plan["slot_moves"], plan
        assert master_slots(spec, capsys) == slot_map

        # keys, killed mid-move (key by key, throttled), then the same command again finishes from where it is
        journal = spec.parent / ".opsctl" / loaded.spec.name / JOURNAL
        env = {**os.environ, PASSWORD_ENV: PASSWORD}
        with Writer(lambda: cluster_client(loaded)) as writer:
            proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "cluster", "rebalance", "-f", str(spec),
                                     "--by", "keys", "--max-keys-per-sec", "1000", "--auto-approve"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + CONDITION_BOUND
            while not journal.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            assert journal.exists(), "the rebalance did not start moving"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait() == -signal.SIGKILL  # killed mid-move, not after it finished
            code, result, err = rebalance(capsys, spec, "--by", "keys", "--auto-approve")
            assert code == 0, err
            writer.wait_for_writes(len(writer.acked) + 100)
        plan = result["plan"]
        assert plan["reached"] and plan["spread_after"] <= 1.1, plan
        code, result, err = rebalance(capsys, spec, "--by", "keys", "--dry-run")
        assert code == 0 and result["plan"]["spread_now"] <= 1.1 and result["moves"] == [], result
        assert writer.verify(client) == []
        assert (dataset_checksum(client, "pre:*"), dataset_checksum(client, "{t*")) == before
        referee_ok(loaded)
        assert not journal.exists()
