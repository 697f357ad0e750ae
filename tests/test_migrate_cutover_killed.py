"""A cutover killed mid-way (issue 26): opsctl migrate SIGKILLed once the source is fenced, and once after the
verification passed, under a writer. The waiting `migrate cutover` says the migration stopped; the source stays
fenced (writes get NOREPLICAS, never a silent OK); running `migrate cutover` again finishes it from the journal:
every acknowledged write in the target, verification OK, redis-cli's check passes. `--lift-fence` lifts the fence
instead, and the migration then resumes and cuts over as before."""

from __future__ import annotations

import pytest
import redis

from opsctl.failover.actions import KILL_AT
from tests.lifecycle import run
from tests.support import PASSWORD, cluster_check, owned_key
from tests.test_migrate_live import Migrate, fill, pair, source_client
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration


def _killed_cutover(t, s, s_loaded, capsys, point: str) -> Migrate:
    migrate = Migrate(t, s, env={KILL_AT: point})
    migrate.streaming()
    code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
    assert code == 1 and "stopped before it reported" in err and "--lift-fence" in err, out + err
    assert migrate.wait() == -9
    with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
        source_client(s_loaded).set("while-fenced", 1)
    return migrate


def _checked(t_loaded, writer: Writer) -> None:
    dst = cluster_client(t_loaded)
    assert writer.verify(dst) == [], "acknowledged writes missing in the target"
    assert dst.get("counter") == "1"
    assert not [k for k in dst.scan_iter("opsctl-migrate:*")], "markers left on the target"
    node = t_loaded.layout.servers[0]
    assert cluster_check(f"{node.address}:{node.port}").returncode == 0


@pytest.mark.parametrize("point", ["migrate-fenced", "migrate-verified"])
def test_a_killed_cutover_is_finished_by_running_cutover_again(tmp_path, capsys, point) -> None:
    with pair(tmp_path, capsys) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        fill(src, 1000)
        with Writer(lambda: source_client(s_loaded)) as writer:
            writer.wait_for_writes(300)
            src.execute_command("INCR", "counter")
            _killed_cutover(t, s, s_loaded, capsys, point)
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0 and "cutover done" in out and "interrupted" in err, out + err
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            src.set("after-cutover", 1)  # done: the source stays fenced, clients point at the target
        _checked(t_loaded, writer)
        code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
        assert code == 1 and "no migration into" in err, out + err  # finished: nothing left to finish


def test_lift_fence_after_a_killed_cutover_then_resume(tmp_path, capsys) -> None:
    with pair(tmp_path, capsys) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        fill(src, 1000)
        src.execute_command("INCR", "counter")
        with Writer(lambda: source_client(s_loaded)) as writer:
            writer.wait_for_writes(300)
            _killed_cutover(t, s, s_loaded, capsys, "migrate-fenced")
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t), "--lift-fence")
            assert code == 0 and "fence lifted" in out, out + err
            assert src.set("after-lift", 1)  # the source serves writes again
            writer.wait_for_writes(len(writer.acked) + 200)
            migrate = Migrate(t, s, "--cutover", "auto")
            assert migrate.wait(120) == 0, migrate.stderr()
        assert migrate.done()["ok"], migrate.done()
        _checked(t_loaded, writer)


def test_a_killed_cutover_of_a_three_master_source_fences_and_finishes_every_shard(tmp_path, capsys) -> None:
    """Three source masters: each is fenced when the kill comes, and the second `migrate cutover` finishes."""
    source = ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 0}})
    with pair(tmp_path, capsys, source) as (s, s_loaded, t, t_loaded):
        src = cluster_client(s_loaded)
        for i in range(1000):
            src.set(f"s:{i}", f"v{i}")
        src.incr("counter")
        with Writer(lambda: cluster_client(s_loaded)) as writer:
            writer.wait_for_writes(300)
            migrate = Migrate(t, s, env={KILL_AT: "migrate-fenced"})
            migrate.streaming()
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 1 and "stopped before it reported" in err, out + err
            assert migrate.wait() == -9
            for node in s_loaded.layout.servers:  # every source master refuses a write to a slot it owns
                one = redis.Redis(host=node.address, port=node.port, password=PASSWORD)
                with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
                    one.set(owned_key(one), 1)
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0 and "cutover done" in out, out + err
        _checked(t_loaded, writer)
