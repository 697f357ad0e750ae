"""Backups in an S3-compatible store (a real moto server on loopback): the store itself (multipart, listing,
deleting), a cluster backed up to s3:// and restored from it into another shape with every value compared, a
tampered object refused by name before anything is written, and no secret in any output, name or metadata."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from opsctl.backup.s3 import S3Store, transfer_config
from opsctl.backup.store import parse_location
from opsctl.base.errors import OpsctlError
from tests.lifecycle import run
from tests.s3server import SECRET, S3Server, s3_prefix_fixture, s3_server_fixture  # noqa: F401 (fixtures)
from tests.test_restore_live import clients, cluster, fill, restore, same_data, snapshot, topologies

pytestmark = pytest.mark.integration

PART = 5 << 20  # S3's smallest part


def test_store_uploads_big_files_in_parts_and_lists_and_deletes(tmp_path, s3_server: S3Server, s3_prefix) -> None:
    location = parse_location(s3_prefix)
    store = S3Store(location, transfer_config(PART))
    big = tmp_path / "big.rdb"
    big.write_bytes(os.urandom(3 * PART + 12345))
    store.put_file("b-1/shard-1.rdb", big)
    store.put_bytes("b-1/manifest.json", b"{}")
    head = s3_server.client().head_object(Bucket=location.bucket, Key=f"{location.prefix}/b-1/shard-1.rdb")
    assert head["ETag"].strip('"').endswith("-4")  # four parts: a multipart upload
    assert head.get("Metadata", {}) == {}
    back = tmp_path / "back.rdb"
    store.get_file("b-1/shard-1.rdb", back)
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()
    assert store.names() == ["b-1/manifest.json", "b-1/shard-1.rdb"]
    assert store.get_bytes("b-1/nothing") is None
    store.delete(store.names("b-1/"))
    assert store.names() == []


def test_an_unknown_bucket_is_named_without_a_secret(s3_server: S3Server) -> None:
    store = S3Store(parse_location("s3://no-such-bucket-here/x"))
    with pytest.raises(OpsctlError) as caught:
        store.put_bytes("a", b"1")
    text = caught.value.render()
    assert "s3://no-such-bucket-here/x/a" in text and "NoSuchBucket" in text and SECRET not in text


def test_backup_to_s3_and_restore_from_it_into_another_shape(tmp_path, capsys, s3_server: S3Server,
                                                             s3_prefix) -> None:
    with topologies(tmp_path, capsys, "valkey", cluster(3), cluster(5), cluster(3)) as deployed_:
        (a, a_loaded), (b, b_loaded), (c, c_loaded) = deployed_
        fill(a_loaded)
        source = snapshot(a_loaded)
        code, out, err = run(capsys, "backup", "-f", str(a), "--to", s3_prefix, "--output", "json")
        assert code == 0, err + out
        url = json.loads(out.splitlines()[-1])["dir"]
        assert url.startswith(s3_prefix + "/") and SECRET not in out + err
        location = parse_location(s3_prefix)
        names = S3Store(location).names()
        assert sorted(n.split("/", 1)[1] for n in names) == ["manifest.json", "shard-1.rdb", "shard-2.rdb",
                                                              "shard-3.rdb"]
        client = s3_server.client()
        for name in names:  # nothing but the file: no metadata, no secret anywhere
            key = f"{location.prefix}/{name}"
            assert client.head_object(Bucket=location.bucket, Key=key).get("Metadata", {}) == {}
            assert SECRET.encode() not in client.get_object(Bucket=location.bucket, Key=key)["Body"].read()
        assert not list((tmp_path / "t0").rglob("backup-staging/*"))  # the staged copy is gone

        code, out, err = run(capsys, "backup", "verify", url)
        assert code == 0 and f"ok {url}" in out, err + out

        code, out, err = restore(capsys, b, "--from", url)  # 3 masters -> 5, from the store
        assert code == 0 and "verified" in out and url in out, err + out
        same_data(source, snapshot(b_loaded))

        shard = next(n for n in names if n.endswith("shard-2.rdb"))
        key = f"{location.prefix}/{shard}"
        raw = bytearray(client.get_object(Bucket=location.bucket, Key=key)["Body"].read())
        raw[len(raw) // 2] ^= 0xFF
        client.put_object(Bucket=location.bucket, Key=key, Body=bytes(raw))
        code, out, err = restore(capsys, c, "--from", url)
        assert code == 1 and f"{url}/shard-2.rdb" in err and "sha256" in err, err + out
        code, out, err = run(capsys, "backup", "verify", url)
        assert code == 1 and f"{url}/shard-2.rdb" in err, err + out
        assert sum(cl.dbsize() for cl in clients(c_loaded)) == 0  # refused before writing

        code, out, err = run(capsys, "backup", "-f", str(a), "--to", "s3://Bad_Bucket/x")
        assert code == 1 and "not an S3 bucket name" in err and "Traceback" not in err, err
