"""The restore engine's source side against a real server: the pages read without expiries (a db its server says
holds no key with a TTL) are the pages read with them, and a page's RESTOREs packed in one step are the bytes the
generic encoder makes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from opsctl.backup.rdb import KeyRecord
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode
from opsctl.restore.engine import PAGE, pages
from opsctl.restore.route import restore_batch, restore_bytes, restore_command
from tests.support import bare_server, server_tmpdir


@pytest.mark.parametrize("args", [
    (b"RESTORE", b"k", 0, b"p", False), (b"R", b"k" * 300, 17, b"p\x00" * 1000, True), (b"RESTORE", b"", 5, b"", False),
    (b"X", b"k", 0, b"pp", True), (b"X", b"k", -3, b"pp", True),
])
def test_restore_bytes_are_the_encoded_command(args) -> None:
    assert restore_bytes(*args) == encode(restore_command(*args))


@pytest.mark.parametrize("replace", [False, True])
def test_a_restore_batch_is_the_encoded_commands_joined(replace: bool) -> None:
    records = [KeyRecord(0, b"k", b"p", 0), KeyRecord(1, b"k" * 300, b"p\x00" * 1000, 17.7),
               KeyRecord(0, b"", b"", 0), KeyRecord(0, b"x", b"pp", -3), KeyRecord(0, b"\r\n", b"z", 0)]
    offset = 1000.5  # the target's clock ahead of ours
    at = {b"k" * 300: 1018, b"x": 997}  # int(expiry + offset)
    assert restore_batch(b"RESTORE", records, offset, replace) == \
        b"".join(encode(restore_command(b"RESTORE", r.key, at.get(r.key, 0), r.payload, replace)) for r in records)
    gone = KeyRecord(0, b"g", b"p", -5000.0)  # past in the target's clock too: 1 ms left, not 0 (no expiry)
    assert restore_batch(b"RESTORE", [gone], offset, replace) == \
        encode(restore_command(b"RESTORE", b"g", 1, b"p", replace))


@pytest.mark.integration
def test_pages_without_expiries_match_pages_with_them() -> None:
    with server_tmpdir("opsctl-pages-") as folder, bare_server("valkey", Path(folder)) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(PAGE * 2 + 345):
            pipe.set(f"k:{i}", f"v{i}")
        pipe.execute()
        kwargs = client.connection_pool.connection_kwargs

        def read(expiries: bool) -> list[tuple[bytes, bytes, float]]:
            sock = socket.create_connection((kwargs["host"], kwargs["port"]), timeout=10)
            with RawPipe.on_socket(sock, "bare") as src:
                return sorted((e.key, e.payload, e.expires) for page in pages(src, 0, "bare", expiries) for e in page)
        without, with_them = read(False), read(True)
        assert len(without) == PAGE * 2 + 345 and without == with_them
        assert all(expires == 0 for _, _, expires in without)
