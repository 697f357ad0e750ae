"""opsctl's side of monitoring (issue 24), pure parts and the file write: Prometheus file_sd target groups from a
layout, and the node_exporter textfile for opsctl's own runs (atomic, last success carried over a failure)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opsctl.metrics.signals import (
    RunSignal,
    last_success_in,
    outcome_of,
    render_textfile,
    textfile_name,
    write_textfile,
)
from opsctl.metrics.targets import EXPORTER_PORT_OFFSET, exporter_port_problems, file_sd_json, target_groups
from opsctl.spec.layout import Layout, Node
from opsctl.state.safefs import FileProblem
from tests.support import make_spec
from tests.test_planner import load_dict


def fixed_spec(topology: str) -> dict:
    spec = make_spec(topology)
    spec["name"] = "orders"
    spec["hosts"] = [{"name": f"h{i}", "address": f"127.0.0.{i}"} for i in (1, 2, 3)]
    if topology == "cluster":
        spec["cluster"]["base_port"] = 7101
    else:
        spec["replication"]["base_port"] = 7201
        spec["sentinel"]["port"] = 7301
    return spec


def test_cluster_targets_are_labelled_per_node_beside_the_node() -> None:
    loaded = load_dict(fixed_spec("cluster"))
    groups = target_groups(loaded.spec, loaded.layout)
    assert len(groups) == 6
    assert groups[0] == {"targets": [f"127.0.0.1:{7101 + EXPORTER_PORT_OFFSET}"],
                         "labels": {"topology": "orders", "node": "orders-1", "host": "h1", "kind": "server",
                                    "shard": "1", "maxclients": "10000"}}
    assert groups[1]["labels"] == {"topology": "orders", "node": "orders-2", "host": "h2", "kind": "server",
                                   "shard": "1", "maxclients": "10000"}
    assert [g["labels"]["shard"] for g in groups] == ["1", "1", "2", "2", "3", "3"]
    assert all("role" not in g["labels"] for g in groups)  # the exporter's own role label stays live
    assert json.loads(file_sd_json(groups)) == groups


def test_sentinels_are_targets_without_a_shard() -> None:
    loaded = load_dict(fixed_spec("sentinel"))
    groups = target_groups(loaded.spec, loaded.layout)
    sentinels = [g for g in groups if g["labels"]["kind"] == "sentinel"]
    assert len(sentinels) == 3 and all("shard" not in g["labels"] for g in sentinels)
    # a Sentinel renders no maxclients: it runs with the built-in 10000 (INFO clients says so; CONFIG is refused)
    assert all(g["labels"]["maxclients"] == "10000" for g in sentinels)
    assert sentinels[0]["targets"] == [f"127.0.0.1:{7301 + EXPORTER_PORT_OFFSET}"]
    assert {g["labels"]["shard"] for g in groups if g["labels"]["kind"] == "server"} == {"1"}


def test_ipv6_targets_are_bracketed_and_the_offset_is_a_parameter() -> None:
    layout = Layout((Node("a-1", "h1", "::1", 7000, "master", 1),))
    spec = load_dict({**fixed_spec("cluster"), "metrics": {"port_offset": 5}}).spec
    assert target_groups(spec, layout)[0]["targets"] == ["[::1]:7005"]


def test_a_server_is_labelled_with_the_maxclients_it_is_rendered_with() -> None:
    """The exporter's user cannot read maxclients (no CONFIG GET): the target label is where RedisTooManyClients
    finds it; the spec's config and a node override change it."""
    spec = {**fixed_spec("cluster"), "config": {"maxclients": 500},
            "nodes": {"orders-2": {"config": {"maxclients": 70}}}}
    loaded = load_dict(spec)
    assert [g["labels"]["maxclients"] for g in target_groups(loaded.spec, loaded.layout)] == \
        ["500", "70", "500", "500", "500", "500"]


def test_exporter_ports_that_cannot_be_bound_are_named() -> None:
    layout = Layout((Node("a-1", "h1", "127.0.0.1", 7000, "master", 1, bus_port=17000),
                     Node("a-2", "h1", "127.0.0.1", 8000, "replica", 1, bus_port=18000),
                     Node("a-3", "h1", "127.0.0.1", 65000, "replica", 1),
                     Node("a-4", "h2", "127.0.0.2", 7000, "master", 2, bus_port=17000)))
    assert exporter_port_problems(layout) == [
        "a-1: exporter port 8000 on 127.0.0.1 is a-2's port",
        "a-3: exporter port 66000 (port 65000 + 1000) is above 65535"]
    assert exporter_port_problems(layout, offset=10000) == [
        "a-1: exporter port 17000 on 127.0.0.1 is a-1's cluster bus port",
        "a-2: exporter port 18000 on 127.0.0.1 is a-2's cluster bus port",
        "a-3: exporter port 75000 (port 65000 + 10000) is above 65535",
        "a-4: exporter port 17000 on 127.0.0.2 is a-4's cluster bus port"]
    assert exporter_port_problems(load_dict(fixed_spec("cluster")).layout) == []


def run(outcome: str = "ok", finished: float = 1_800_000_000.25, keys: int | None = None) -> RunSignal:
    return RunSignal("backup", "orders", finished, 12.5, outcome, keys)  # type: ignore[arg-type]


def test_textfile_reports_the_run_with_topology_labels() -> None:
    text = render_textfile(run(keys=1234))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        'opsctl_last_run_timestamp_seconds{command="backup",topology="orders"} 1800000000.250',
        'opsctl_last_run_duration_seconds{command="backup",topology="orders"} 12.500',
        'opsctl_last_run_outcome{command="backup",topology="orders",outcome="ok"} 1',
        'opsctl_last_run_outcome{command="backup",topology="orders",outcome="error"} 0',
        'opsctl_last_run_outcome{command="backup",topology="orders",outcome="refused"} 0',
        'opsctl_last_success_timestamp_seconds{command="backup",topology="orders"} 1800000000.250',
        'opsctl_last_run_keys_moved{command="backup",topology="orders"} 1234']
    assert text.count("# TYPE ") == 5 and text.endswith("\n")


def test_a_failed_run_keeps_the_last_success_and_none_is_zero() -> None:
    good = render_textfile(run())
    failed = render_textfile(run("error", finished=1_800_000_900), previous=good)
    assert last_success_in(failed) == 1_800_000_000.25
    assert 'outcome="error"} 1' in failed and "keys_moved" not in failed
    assert last_success_in(render_textfile(run("refused"), previous=None)) == 0
    assert last_success_in("garbage\nopsctl_last_success_timestamp_seconds{} NaN\n") is None
    assert last_success_in("opsctl_last_success_timestamp_seconds{a=\"b\"} x\n") is None


def test_label_values_are_escaped_and_file_names_are_safe() -> None:
    text = render_textfile(RunSignal('cluster "re"\\shard\n', "orders", 1.0, 1.0, "ok"))
    assert 'command="cluster \\"re\\"\\\\shard\\n"' in text
    assert textfile_name("orders", "cluster reshard") == "opsctl_orders_cluster_reshard.prom"
    assert textfile_name("a", "../../etc/x") == "opsctl_a_etc_x.prom"


@pytest.mark.parametrize(("code", "outcome"), [(0, "ok"), (2, "ok"), (3, "refused"), (1, "error"), (4, "error")])
def test_outcome_of_an_exit_code(code: int, outcome: str) -> None:
    assert outcome_of(code) == outcome


def test_write_textfile_replaces_the_file_atomically_and_readably(tmp_path: Path) -> None:
    path = write_textfile(tmp_path, run())
    assert path == tmp_path / "opsctl_orders_backup.prom"
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # node_exporter runs as its own user
    write_textfile(tmp_path, run("error", finished=1_800_000_500))
    assert last_success_in(path.read_text()) == 1_800_000_000.25
    assert os.listdir(tmp_path) == ["opsctl_orders_backup.prom"]  # no temp file left behind


def test_write_textfile_refuses_a_missing_folder_and_a_link(tmp_path: Path) -> None:
    with pytest.raises(FileProblem, match="does not exist"):
        write_textfile(tmp_path / "nope", run())
    assert not (tmp_path / "nope").exists()
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / "opsctl_orders_backup.prom").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileProblem, match="symbolic link"):
        write_textfile(tmp_path, run())
    assert (tmp_path / "elsewhere").read_text() == "x"
