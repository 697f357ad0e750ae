"""Writes never go through a link; reads back are bounded and name the file (issue 11 items 6 and 9)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsctl.base.errors import echo
from opsctl.state.safefs import FileProblem, check_state_path, make_dir, read_bounded, write_private


def test_write_private_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    folder = tmp_path / "node"
    folder.mkdir()
    for name in (".redis.conf.tmp", "redis.conf"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(victim)
    with pytest.raises(FileProblem, match="symbolic link"):
        write_private(folder / "redis.conf", "requirepass x\n")
    (folder / "redis.conf").unlink()
    write_private(folder / "redis.conf", "requirepass x\n")
    assert victim.read_text() == "precious"
    assert (folder / "redis.conf").read_text() == "requirepass x\n"
    assert (folder / "redis.conf").stat().st_mode & 0o777 == 0o600


def test_write_private_refuses_a_linked_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "node").symlink_to(real)
    with pytest.raises(FileProblem, match="symbolic link"):
        write_private(tmp_path / "node" / "redis.conf", "x")
    assert list(real.iterdir()) == []


def test_write_private_refuses_a_device_or_folder_target(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(FileProblem, match="not a regular file"):
        write_private(tmp_path / "dir", "x")


def test_state_path_links_and_foreign_owners_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / ".opsctl").symlink_to(real)
    with pytest.raises(FileProblem, match="symbolic link"):
        check_state_path(tmp_path / ".opsctl" / "demo", below=tmp_path)
    (tmp_path / ".opsctl").unlink()
    make_dir(tmp_path / ".opsctl" / "demo")
    check_state_path(tmp_path / ".opsctl" / "demo", below=tmp_path)
    with pytest.raises(FileProblem, match="owned by"):
        check_state_path(tmp_path / ".opsctl" / "demo", below=tmp_path, owners=frozenset({os.geteuid() + 12345}))


@pytest.mark.parametrize("shape", ["folder", "link", "huge", "binary"])
def test_read_bounded_names_the_file(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "record.json"
    if shape == "folder":
        path.mkdir()
    elif shape == "link":
        path.symlink_to(tmp_path / "x")
    elif shape == "huge":
        path.write_text("x" * 2000)
    else:
        path.write_bytes(b"\xff\xfe")
    with pytest.raises(FileProblem) as caught:
        read_bounded(path, "delete it", limit=1000)
    assert str(path) in caught.value.render() and "hint: " in caught.value.render()


def test_echo_cuts_long_input() -> None:
    assert echo("abc") == "'abc'"
    long = echo("x" * 10_000)
    assert len(long) < 120 and "10000 characters" in long


def test_a_file_where_a_folder_should_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "failover").write_text("x")
    with pytest.raises(FileProblem, match="failover: is not a folder"):
        write_private(tmp_path / "failover" / "report.json", "{}")
