"""Issue 33 item 6 and its classes, against a real moto S3 server and a real standalone server of each flavor: a
bucket that does not exist, an endpoint that does not answer or names port 70000, a mistyped scheme, a location
that is not there, each refused before any shard is saved (no fork on the server, nothing staged, nothing in the
store), exit 1, no "internal error", no traceback, no secret of the URL or the AWS configuration echoed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from opsctl.backup.offsite import STAGING
from tests.lifecycle import deployed, run
from tests.s3server import SECRET, S3Server, s3_prefix_fixture, s3_server_fixture  # noqa: F401 (fixtures)
from tests.test_backup_live import forks

pytestmark = pytest.mark.integration

URL_SECRET = "url-pw-3b7e1c"  # a password inside AWS_ENDPOINT_URL: never printed back


def refused(capsys, *argv: str, said: str) -> str:
    code, out, err = run(capsys, *argv)
    text = out + err
    assert code == 1 and said in err, (argv, text)
    assert "internal error" not in text and "Traceback" not in text, text
    assert SECRET not in text and URL_SECRET not in text, text
    return err


def staged(spec: Path) -> list[Path]:
    return [p for p in spec.parent.rglob(f"{STAGING}/*")]


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_backup_to_a_store_that_cannot_take_it_is_refused_before_any_save(
        tmp_path, capsys, monkeypatch, flavor, s3_server: S3Server, s3_prefix) -> None:
    monkeypatch.chdir(tmp_path)  # a mistyped scheme taken as a folder would appear here
    with deployed(tmp_path, capsys, "standalone", flavor) as (spec, loaded):
        before = forks(loaded, "master")
        client = s3_server.client()
        missing = f"no-such-bucket-{uuid.uuid4().hex[:8]}"

        err = refused(capsys, "backup", "-f", str(spec), "--to", f"s3://{missing}/p", said="no such bucket")
        assert f"s3://{missing}/p" in err and "create it" in err
        for typo in ("s4://opsctl-tests/p", "S3://opsctl-tests/p", "s3:/opsctl-tests/p", "file:/tmp/p"):
            refused(capsys, "backup", "-f", str(spec), "--to", typo, said="is not a location scheme")
        with monkeypatch.context() as env:
            env.setenv("AWS_ENDPOINT_URL", f"http://opsctl:{URL_SECRET}@127.0.0.1:1")  # nothing listens on 1
            env.setenv("AWS_MAX_ATTEMPTS", "1")
            err = refused(capsys, "backup", "-f", str(spec), "--to", s3_prefix, "--continuous",
                          said="the endpoint does not answer")
            assert "http://***@127.0.0.1:1" in err
            env.setenv("AWS_ENDPOINT_URL", s3_server.endpoint.rsplit(":", 1)[0] + ":70000")
            refused(capsys, "backup", "-f", str(spec), "--to", s3_prefix, said="not a number from 1 to 65535")
            env.setenv("AWS_PROFILE", "no-such-profile")
            env.delenv("AWS_ENDPOINT_URL")
            refused(capsys, "backup", "-f", str(spec), "--to", s3_prefix, said="AWS_PROFILE")

        assert forks(loaded, "master") == before  # not one shard was saved
        assert staged(spec) == []
        assert sorted(p.name for p in tmp_path.iterdir() if ":" in p.name) == []  # no folder named s4:, S3:, ...
        assert client.list_objects_v2(Bucket=s3_server.bucket, Prefix=s3_prefix.split("/", 3)[3]).get(
            "Contents", []) == []

        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", s3_prefix)  # the same store, answering
        assert code == 0, err + out
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_server.bucket,
                                                         Prefix=s3_prefix.split("/", 3)[3])["Contents"]]
        assert sorted(k.rsplit("/", 1)[1] for k in keys) == ["manifest.json", "shard-1.rdb"]  # the probe left none


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_location_that_is_not_there_is_an_error_not_an_empty_one(tmp_path, capsys, flavor, s3_server: S3Server,
                                                                   s3_prefix) -> None:
    with deployed(tmp_path, capsys, "standalone", flavor) as (spec, _loaded):
        empty = f"{s3_prefix}/nothing-here"
        refused(capsys, "backup", "list", "--from", empty, said=f"no backup at {empty}")
        refused(capsys, "backup", "list", "--from", str(tmp_path / "none"), said="no backup at")
        refused(capsys, "backup", "list", "--from", "s3://no-such-bucket-opsctl/x", said="no such bucket")
        refused(capsys, "backup", "verify", f"{empty}/x-20261201T000000Z", said="no backup at")
        refused(capsys, "restore", "-f", str(spec), "--from", f"{empty}/x-20261201T000000Z", said="no backup at")
        refused(capsys, "restore", "-f", str(spec), "--from", empty, "--to-time", "2026-12-01T00:00:00Z",
                said="no backup at")
        refused(capsys, "restore", "-f", str(spec), "--from", "s4://opsctl-tests/x", said="is not a location scheme")
        refused(capsys, "restore", "-f", str(spec), "--from", str(tmp_path / "none"), said="no backup at")
        assert [p for p in (spec.parent / ".opsctl").rglob(".restore-*")] == []
