"""Function libraries travel with the data (Redis 7 and later keep them in the RDB): a backup restored into
another shape, a live restore and a live migration load them on every target master; a library the target holds
with other code is refused by name, before any key is written."""

from __future__ import annotations

import json

import pytest
import redis

from tests.support import PASSWORD
from tests.test_migrate_live import Migrate, pair, source_client
from tests.test_restore_live import backup_dir, clients, restore, topologies
from tests.writer import cluster_client

pytestmark = pytest.mark.integration

LIBRARY = "#!lua name=shop\nredis.register_function('greet', function(keys, args) return 'hi ' .. args[1] end)"
OTHER = "#!lua name=shop\nredis.register_function('greet', function(keys, args) return 'bye' end)"


def _greets(client: redis.Redis) -> bytes | str:
    return client.fcall("greet", 0, "there")  # type: ignore[no-any-return]


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_backup_and_a_live_restore_load_the_libraries_on_every_master(tmp_path, capsys, flavor: str) -> None:
    shapes = ("standalone", {}), ("cluster", {"cluster": {"masters": 3, "replicas_per_master": 0}}), \
        ("cluster", {"cluster": {"masters": 3, "replicas_per_master": 0}})
    with topologies(tmp_path, capsys, flavor, *shapes) as [(s, s_loaded), (c, c_loaded), (d, d_loaded)]:
        source = clients(s_loaded)[0]
        source.function_load(LIBRARY)
        source.mset({f"k:{i}": i for i in range(100)})
        folder = backup_dir(capsys, s, tmp_path / "backups")
        code, out, err = restore(capsys, c, "--from", str(folder), "--output", "json")
        assert code == 0, err + out
        report = json.loads(out.splitlines()[-1])
        assert {k: v["libraries"] for k, v in report["sources"].items()} == {k: 1 for k in report["sources"]}
        assert [_greets(m) for m in clients(c_loaded)] == [b"hi there"] * 3

        clients(d_loaded)[1].function_load(OTHER)
        code, out, err = restore(capsys, d, "--from-live", str(s))
        assert code == 3 and "'shop' differs between" in err and "FUNCTION LOAD REPLACE" in err, err + out
        assert sum(m.dbsize() for m in clients(d_loaded)) == 0, "keys written after the refusal"
        assert PASSWORD not in err + out


def test_a_migration_loads_the_libraries_on_every_target_master(tmp_path, capsys) -> None:
    with pair(tmp_path, capsys) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        src.function_load(LIBRARY)
        src.set("a", 1)
        migrate = Migrate(t, s, "--cutover", "auto")
        assert migrate.wait() == 0, migrate.stderr()
        assert migrate.done()["ok"]
        masters = [redis.Redis(host=n.address, port=n.port, password=PASSWORD) for n in t_loaded.layout.servers
                   if n.role == "master"]
        assert [_greets(m) for m in masters] == [b"hi there"] * len(masters)
        assert cluster_client(t_loaded).get("a") == "1"


def test_source_shards_whose_libraries_differ_are_refused_before_any_shard_copies(tmp_path, capsys) -> None:
    """Each shard of a cluster holds its own copy of a library; one that differs would stop only its own shard's
    copy, after the others wrote their keys: the whole restore is refused first (and migrate, through the same
    check_libraries)."""
    three = ("cluster", {"cluster": {"masters": 3, "replicas_per_master": 0}})
    with topologies(tmp_path, capsys, "valkey", three, three) as [(s, s_loaded), (t, t_loaded)]:
        masters = clients(s_loaded)
        for master, code in zip(masters, (LIBRARY, LIBRARY, OTHER), strict=True):
            master.function_load(code)
        cluster_client(s_loaded).mset_nonatomic({f"k:{i}": i for i in range(300)})
        code, out, err = restore(capsys, t, "--from-live", str(s))
        assert code == 3 and "'shop' differs between" in err and "nothing was written" in err, err + out
        assert sum(m.dbsize() for m in clients(t_loaded)) == 0, "a shard copied before the refusal"
        assert all(m.function_list() == [] for m in clients(t_loaded)), "a library loaded before the refusal"


def test_a_migration_from_shards_whose_libraries_differ_is_refused_before_any_shard_copies(tmp_path, capsys) -> None:
    three = ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 0}})
    with pair(tmp_path, capsys, three, three) as (s, s_loaded, t, t_loaded):
        masters = clients(s_loaded)
        for master, code in zip(masters, (LIBRARY, OTHER, LIBRARY), strict=True):
            master.function_load(code)
        cluster_client(s_loaded).mset_nonatomic({f"k:{i}": i for i in range(300)})
        migrate = Migrate(t, s, "--cutover", "auto")
        assert migrate.wait() == 3
        err = migrate.stderr()
        assert "'shop' differs between source shard-" in err and "nothing was written" in err, err
        assert sum(m.dbsize() for m in clients(t_loaded)) == 0, "a shard copied before the refusal"
        assert all(m.function_list() == [] for m in clients(t_loaded)), "a library loaded before the refusal"
        assert PASSWORD not in err
        again = Migrate(t, s, "--cutover", "auto")  # the refusal left no journal a re-run would resume past it
        assert again.wait() == 3 and "differs between source shard-" in again.stderr(), again.stderr()
        assert sum(m.dbsize() for m in clients(t_loaded)) == 0, "the re-run copied past the refusal"
