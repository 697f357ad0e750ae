"""Hostile input found by the second adversarial pass (issue 11's classes): Jinja in spec values reaching Ansible,
read-back files nested too deeply, unbounded reads, paths the OS refuses, foreign output folders, unclipped
messages. No servers: each case is refused (or made harmless) before anything runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.backup.manifest import parse_manifest
from opsctl.base.errors import OpsctlError
from opsctl.cli.main import main
from opsctl.providers.base import parse_record
from opsctl.providers.remote.bundle import read_binary
from opsctl.restore.route import parse_journal
from opsctl.slots.journal import parse_lines
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

JINJA = "{{ lookup('pipe', 'id') }}"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


class _TagLoader(yaml.SafeLoader):
    """Keeps each scalar's tag: ("!unsafe", text) for tagged strings."""


def _scalar(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    assert isinstance(node, yaml.ScalarNode)
    return (node.tag, node.value)


_TagLoader.add_constructor("!unsafe", _scalar)


def _plain_strings(value: object, path: str = "") -> list[str]:
    """Paths of string values Ansible would template (not tagged !unsafe)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _plain_strings(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _plain_strings(v, f"{path}[{i}]")]
    return [path] if isinstance(value, str) else []


def test_inventory_values_are_never_templated(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Ansible templates inventory values: ssh_key "{{ lookup('pipe', 'id') }}" ran `id` on the controller."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = make_spec("sentinel", provider="ansible", server={"flavor": "valkey", "version": "9.1",
                                                             "binary": f"/opt/{JINJA}/valkey-server"})
    spec["hosts"][0] |= {"ssh_user": "ops", "ssh_key": f"/keys/{JINJA}", "bastion": "jump.example:2222"}
    spec_dir = tmp_path / "a\nall: {vars: {x: 1}}"  # the spec's path is echoed in the header comment
    spec_dir.mkdir()
    code, out = run(["inventory", "-f", str(write_spec(spec_dir, spec)), "--dir", str(tmp_path / "inv")], capsys)
    assert code == 0, out
    text = (tmp_path / "inv" / f"{spec['name']}.yml").read_text()
    data = yaml.load(text, Loader=_TagLoader)
    assert data["all"]["hosts"]["h1"]["ansible_ssh_private_key_file"] == ("!unsafe", f"/keys/{JINJA}")
    assert _plain_strings(data) == []
    assert text.splitlines()[1] == "all:"  # the header stayed one comment line


@pytest.mark.parametrize("parse", [
    lambda text: parse_manifest(text, "m.json"),
    lambda text: parse_journal(text, "restore.json"),
    lambda text: parse_lines([text, "{}"], "slots.journal"),
], ids=["backup-manifest", "restore-journal", "slot-journal"])
@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000],
                         ids=["list", "object"])
def test_read_back_nested_too_deeply_is_named(parse: Any, text: str) -> None:
    with pytest.raises(OpsctlError):
        parse(text)


def test_backup_manifest_is_read_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    with open(backup / "manifest.json", "wb") as handle:  # sparse: no disk used
        handle.truncate(256 * 1024 * 1024)
    code, out = run(["backup", "verify", str(backup)], capsys)
    assert code == 1 and "too big" in out and "internal error" not in out


def test_secret_file_path_with_nul_is_a_spec_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec("standalone", hosts=1, auth={"mode": "password", "password": {"file": "pw\x00x"}})
    code, out = run(["validate", "-f", str(write_spec(tmp_path, spec))], capsys)
    assert code == 1 and "internal error" not in out and "NUL" in out


@pytest.mark.parametrize("config", [{"loadmodule": "/x" * 100_000}, {"hz": "9" * 200_000}], ids=["unsafe", "typed"])
def test_spec_problems_quote_values_clipped(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, config: dict[str, str]) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    code, out = run(["validate", "-f", str(write_spec(tmp_path, make_spec("standalone", hosts=1, config=config)))],
                    capsys)
    assert code == 1 and len(out) < 2000, out[:300]


@pytest.mark.parametrize("argv", [
    ["render", "-f", "{spec}", "--dir", "{long}"],
    ["plan", "-f", "{spec}", "--out", "{long}"],
    ["inventory", "-f", "{spec}", "--dir", "{long}"],
    ["backup", "verify", "{long}"],
    ["render", "-f", "{spec}", "--dir", "/proc/self/x"],
], ids=["render", "plan-out", "inventory", "backup-verify", "render-proc"])
def test_paths_the_os_refuses_are_named(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1))
    long = str(tmp_path / ("x" * 5000))
    code, out = run([a.format(spec=spec, long=long) for a in argv], capsys)
    assert code == 1 and "internal error" not in out and len(out) < 2000, out[-300:]
    assert "hint:" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user")
@pytest.mark.parametrize("argv", [["render", "-f", "{spec}", "--dir", "{out}"],
                                  ["inventory", "-f", "{spec}", "--dir", "{out}", "--with-files"]],
                         ids=["render", "inventory"])
def test_output_folder_owned_by_someone_else_is_refused(argv: list[str], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendered files hold the password: never into a folder another user controls (and could swap)."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("standalone", hosts=1, provider="ansible"))
    out_dir = tmp_path / "shared"
    out_dir.mkdir(mode=0o777)
    os.chown(out_dir, 65534, 65534)
    code, out = run([a.format(spec=spec, out=out_dir) for a in argv], capsys)
    assert code == 1 and "is owned by" in out, out
    assert list(out_dir.iterdir()) == []



@pytest.mark.parametrize("make", [lambda d: "/dev/zero", lambda d: _fifo(d)], ids=["dev-zero", "fifo"])
def test_server_binary_to_ship_is_a_bounded_regular_file(make: Any, tmp_path: Path) -> None:
    """inventory --with-files and the Ansible provider read server.binary whole: /dev/zero never ended."""
    with pytest.raises(OpsctlError, match="not a regular file"):
        read_binary(make(tmp_path))


def _fifo(folder: Path) -> str:
    path = folder / "fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("text", ['{"directives": null}', '{"directives": null, "digest": null, "applied": null}'])
def test_node_record_with_null_fields_reads_as_empty(text: str) -> None:
    """A record whose directives were null made `opsctl plan` end in "internal error: TypeError"."""
    assert parse_record(text, "opsctl-node.json").directives == ()


@pytest.mark.parametrize("text", ['{"directives": {}}', '{"directives": [["a"]]}', '{"directives": [[1, 2]]}',
                                  '{"digest": 5}', '{"applied": "x"}', '{"pending_restart": "yes"}', "[]", "{",
                                  '{"deployed": []}', '{"deployed": {"host": "h1"}}',
                                  '{"deployed": {"host": "h1", "port": "1", "role": "master", "shard": 1}}'])
def test_node_record_bad_shapes_are_named(text: str) -> None:
    with pytest.raises(OpsctlError, match=r"^opsctl-node\.json: "):
        parse_record(text, "opsctl-node.json")


@pytest.mark.parametrize(("field", "value"), [
    ("ssh_user", "-oProxyCommand=id"), ("ssh_user", "a b"), ("ssh_user", "$(id)"), ("ssh_user", ""),
    ("ssh_user", "u" * 33), ("bastion", "-oProxyCommand=id@jump"), ("bastion", "ops@jump:22 -v"),
    ("bastion", "a@b@c"), ("bastion", ""), ("bastion", "jump:"),
])
def test_ssh_login_and_bastion_are_plain(field: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """They reach ssh's argv (ProxyCommand) and the inventory: validate refuses anything but a login and an
    address, instead of ssh failing (or reading an option) later."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = make_spec("standalone", hosts=1, provider="ansible")
    spec["hosts"][0][field] = value
    code, out = run(["validate", "-f", str(write_spec(tmp_path, spec))], capsys)
    assert code == 1 and f"hosts[0].{field}" in out and "hint:" in out, out


@pytest.mark.parametrize("bastion", ["jump.example", "ops@jump.example:2222", "ops@[2001:db8::1]:22", "h2",
                                     "10.0.0.9"])
def test_usual_bastions_pass(bastion: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = make_spec("standalone", hosts=2, provider="ansible")
    spec["hosts"][0] |= {"bastion": bastion, "ssh_user": "deploy_bot.1"}
    code, out = run(["validate", "-f", str(write_spec(tmp_path, spec))], capsys)
    assert code == 0, out
