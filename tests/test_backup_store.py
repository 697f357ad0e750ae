"""Backup locations, pure and on a folder: s3:// URLs parsed or refused by name, the folder store's objects, and
the s3 extra named when boto3 is missing (no server needed)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from opsctl.backup.offsite import open_store
from opsctl.backup.store import FolderStore, parse_location
from opsctl.base.errors import OpsctlError


def test_locations() -> None:
    assert parse_location("/backups").folder == Path("/backups")
    s3 = parse_location("s3://my-bucket/team/orders/")
    assert (s3.remote, s3.bucket, s3.prefix) == (True, "my-bucket", "team/orders")
    assert parse_location("s3://my-bucket").prefix == ""
    assert s3.child("orders-20261127T140000Z").text == "s3://my-bucket/team/orders/orders-20261127T140000Z"
    for bad, said in (("s3://My_Bucket/x", "not an S3 bucket name"), ("s3:///x", "not an S3 bucket name"),
                      ("s3://bucket/a//b", "prefix"), ("s3://bucket/a/../b", "prefix"),
                      ("s3://bucket/a b", "prefix")):
        with pytest.raises(OpsctlError, match=said):
            parse_location(bad)


def test_folder_store(tmp_path) -> None:
    store = FolderStore(parse_location(str(tmp_path / "b")))
    assert store.names() == []
    store.put_bytes("x-1/stream/shard-1/a.seg", b"abc")
    store.put_bytes("x-1/manifest.json", b"{}")
    (tmp_path / "b" / ".x-2.partial").mkdir()
    assert store.names() == ["x-1/manifest.json", "x-1/stream/shard-1/a.seg"]
    assert store.names("x-1/stream/") == ["x-1/stream/shard-1/a.seg"]
    assert stat.S_IMODE((tmp_path / "b" / "x-1" / "stream").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "b" / "x-1" / "manifest.json").stat().st_mode) == 0o600
    assert store.get_bytes("x-1/stream/shard-1/a.seg") == b"abc" and store.get_bytes("nope") is None
    store.delete(store.names("x-1/"))
    assert store.names() == [] and not (tmp_path / "b" / "x-1").exists()
    with pytest.raises(OpsctlError, match="not an object name"):
        store.put_bytes("../escape", b"x")


def test_a_missing_boto3_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    with pytest.raises(OpsctlError) as caught:
        open_store(parse_location("s3://bucket/x"))
    assert "boto3" in caught.value.summary and "opsctl-redis[s3]" in caught.value.hint


def test_cli_refuses_bad_archive_arguments_before_connecting(tmp_path, capsys) -> None:
    """No server runs here: every one of these stops before opsctl connects to anything, exit 1, no traceback."""
    from tests.lifecycle import run
    from tests.support import make_spec, write_spec

    spec = str(write_spec(tmp_path, make_spec("standalone")))
    cases = [
        (["restore", "-f", spec, "--from", str(tmp_path), "--to-time", "2026-11-27T14:01:00"], "has no time zone"),
        (["restore", "-f", spec, "--from", str(tmp_path), "--to-time", "yesterday"], "not an ISO 8601 time"),
        (["restore", "-f", spec, "--from-live", spec, "--to-time", "2026-11-27T14:01:00Z"], "not from a running"),
        (["backup", "list"], "usage: opsctl backup list --from"),
        (["backup", "prune", "--from", str(tmp_path)], "--keep-days N"),
        (["backup", "-f", spec, "--to", "s3://Bad_Bucket/x", "--continuous"], "not an S3 bucket name"),
    ]
    for argv, said in cases:
        code, out, err = run(capsys, *argv)
        assert code == 1 and said in err and "Traceback" not in err, (argv, err + out)
    code, out, err = run(capsys, "backup", "list", "--from", str(tmp_path / "none"))
    assert code == 1 and "no backup at" in err and "does not exist" in err, err  # not read as an empty location
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, "backup", "list", "--from", str(tmp_path / "empty"))
    assert code == 0 and "0 base(s)" in out, err
