"""The pure side of provider: ansible's exporters: where an exporter's files live, what bin/opsctl-node runs it
with, what removes it, and `metrics targets --write-to HOST:PATH` parsing. No host needed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.metrics.exporter import exporter_run
from opsctl.plan.desired import desired_node
from opsctl.providers import ansibleexporter as remote
from opsctl.providers.remote.inventory import remote_paths
from opsctl.providers.remote.publish import parse_write_to, target_of
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, make_spec, write_spec


def loaded_spec(tmp_path: Path, provider: str, **extra: object) -> LoadedSpec:
    data = make_spec("sentinel", "redis", metrics={"exporter": True}, **extra)
    data["provider"] = provider
    return read_spec(write_spec(tmp_path, data))


def test_an_ansible_exporter_has_a_folder_of_its_own(tmp_path: Path) -> None:
    """The exporter's user cannot enter the node's folder: its password file lies beside the spec's folder."""
    loaded = loaded_spec(tmp_path, "ansible")
    node = loaded.layout.servers[0]
    paths = remote_paths(loaded.spec, node)
    run = exporter_run(loaded, desired_node(loaded, node, paths, True))
    home = f"/var/lib/opsctl/{loaded.spec.name}.exporters/{node.name}"
    assert remote.home(loaded, node) == home
    assert run.args[run.args.index("-redis.password-file") + 1] == f"{home}/exporter-password.json"
    assert PASSWORD not in " ".join(run.args)


def test_tls_files_are_the_exporters_copies(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "ansible", tls={"enabled": True, "generate": True})
    node = loaded.layout.sentinels[0]
    run = exporter_run(loaded, desired_node(loaded, node, remote_paths(loaded.spec, node), True))
    home = remote.home(loaded, node)
    assert run.args[run.args.index("-tls-ca-cert-file") + 1] == f"{home}/tls-ca.crt"
    assert run.args[run.args.index("-tls-client-key-file") + 1] == f"{home}/tls.key"
    assert remote.file_names(loaded) == ["exporter-password.json", "tls-ca.crt", "tls.crt", "tls.key"]


def test_local_exporters_keep_the_node_folder(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "local")
    node = loaded.layout.servers[0]
    paths = remote_paths(loaded.spec, node)
    run = exporter_run(loaded, desired_node(loaded, node, paths, True))
    assert run.args[run.args.index("-redis.password-file") + 1] == f"{paths.dir}/exporter-password.json"


def test_settings_name_no_secret_and_run_in_the_foreground(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "ansible")
    node = loaded.layout.servers[1]
    run = exporter_run(loaded, desired_node(loaded, node, remote_paths(loaded.spec, node), True))
    text = remote.settings_text(loaded, node, run)
    values = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert shlex.split(shlex.split(values["OPSCTL_ARGS"])[0]) == list(run.args)  # sourced, then split unquoted
    assert values["OPSCTL_FOREGROUND"] == "yes" and values["OPSCTL_USER"] == "opsctl-exporter"
    assert values["OPSCTL_PORT"] == str(node.port + 1000)
    assert run.password.reveal() not in text and PASSWORD not in text
    assert remote.exporter_vars(loaded, node, run)["name"] == f"{node.name}-exporter"


def test_remove_command_deletes_folder_settings_state_and_unit(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "ansible")
    node = loaded.layout.servers[0]
    command = remote.remove_command(loaded, node)
    name = loaded.spec.name
    assert f"/var/lib/opsctl/{name}/bin/opsctl-node stop {node.name}-exporter" in command
    for path in (remote.home(loaded, node), remote.settings_file(loaded, node), remote.state_file(loaded, node)):
        assert path in command
    assert f"rmdir /var/lib/opsctl/{name}.exporters" in command


@pytest.mark.parametrize(("text", "host", "path"), [
    ("prom:/etc/prometheus/opsctl/orders.json", "prom", "/etc/prometheus/opsctl/orders.json"),
    ("ops@198.18.0.9:/srv/t.json", "ops@198.18.0.9", "/srv/t.json"),
    ("[::1]:/t.json", "[::1]", "/t.json"),
])
def test_write_to_parses_host_and_absolute_path(text: str, host: str, path: str) -> None:
    assert parse_write_to(text) == (host, path)


@pytest.mark.parametrize("text", ["prom", "prom:relative.json", ":/t.json", "prom:/etc/"])
def test_write_to_refuses_what_names_no_file(text: str) -> None:
    with pytest.raises(OpsctlError) as caught:
        parse_write_to(text)
    assert "HOST:/" in caught.value.summary + (caught.value.hint or "")


def test_write_to_uses_a_spec_hosts_ssh_settings(tmp_path: Path) -> None:
    loaded = loaded_spec(tmp_path, "ansible")
    host = loaded.spec.hosts[1]
    target = target_of(loaded.spec, host.name)
    assert (target.address, target.user) == (host.address, host.ssh_user or "root")
    other = target_of(loaded.spec, "prom@198.18.0.9")
    assert (other.address, other.user, other.port) == ("198.18.0.9", "prom", 22)


def test_a_host_that_cannot_install_the_package_gets_the_way_on() -> None:
    from opsctl.providers.ansibleexporter import INSTALL_TASK, install_error

    failed = OpsctlError(f"exporters.yml failed on host h1, task '{INSTALL_TASK}'", "h1: No package matching")
    error = install_error(failed)
    assert error.summary == failed.summary and "apt-get install prometheus-redis-exporter" in (error.hint or "")
    other = OpsctlError("exporters.yml failed on host h1, task 'Start each exporter'", "", "look at the log")
    assert install_error(other) is other
