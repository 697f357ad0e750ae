"""A real local S3 server for the tests: moto in server mode (`python -m moto.server`) on a loopback port.

`s3_server` (session; a test module imports s3_server_fixture and s3_prefix_fixture) starts it once, points
boto3 at it through the usual variables (AWS_ENDPOINT_URL, a test key pair, a region) and makes a bucket; each
test gets its own prefix (`s3_prefix`). Missing moto: a skip, a failure under CI=true (tests.support.missing).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.support import CONDITION_BOUND, free_base_port, missing

BUCKET = "opsctl-tests"
SECRET = "s3-test-secret-5d1e9a"  # must appear in no output, object name or metadata


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client(self):  # boto3's S3 client, for checks behind opsctl's back
        import boto3

        return boto3.session.Session().client("s3")


def _wait_port(host: str, port: int, process: subprocess.Popen[bytes], timeout: float = CONDITION_BOUND) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"moto_server did not listen within {timeout:.0f} s")


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, boto3 pointed at it through the environment, the test bucket made;
    the environment as it was afterwards. Raises ImportError without moto."""
    import boto3  # noqa: F401
    import moto.server  # noqa: F401

    host = "127.0.0.1"
    port = free_base_port([host], 1, bus=False)
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE",
                                            "AWS_SHARED_CREDENTIALS_FILE")}
    try:
        _wait_port(host, port, process)
        os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "opsctl-test-key",
                           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
        os.environ.pop("AWS_PROFILE", None)
        server = S3Server(f"http://{host}:{port}", BUCKET)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)  # a bound: beside two CPU hogs 10 s was short
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session", name="s3_server")
def s3_server_fixture() -> Iterator[S3Server]:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        missing("moto[server] and boto3 (pip install -e '.[dev]')")
    with moto_server() as server:
        yield server


@pytest.fixture(name="s3_prefix")
def s3_prefix_fixture(s3_server: S3Server) -> str:
    """A fresh prefix of the test bucket as an s3:// URL."""
    return s3_server.url(f"t-{uuid.uuid4().hex[:12]}")
