"""A standby on the Ansible lab following a local primary (issue 36, must show): the standby spec's server runs on
a network-namespace host, deployed through ansible-runner like the other remote tests, and `follows: {spec: ...}`
a provider: local standalone on loopback. The link (`opsctl follow`) runs here, reading the local primary and
writing to the lab host. Applied fenced (a client's write refused), followed, a writer's acknowledged writes on
the standby, switched over: the standby takes writes, the old primary refuses them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from tests import netns
from tests.lifecycle import applied, deployed, run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, netns_lab, server_binary
from tests.test_migrate_live import source_client
from tests.test_standby_live import Follow
from tests.writer import Writer

pytestmark = pytest.mark.remote


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(1)


def test_a_standby_on_the_lab_follows_a_local_primary_and_takes_over(
        lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    tmp_path.chmod(0o711)  # the local server's user passes through to its state dir
    with ExitStack() as stack:
        for folder in ("primary", "standby"):
            (tmp_path / folder).mkdir(mode=0o711)
        p, p_loaded = stack.enter_context(deployed(tmp_path / "primary", capsys, "standalone", "valkey"))
        spec = make_spec("standalone", "valkey", hosts=1, follows={"spec": str(p)})
        spec.update(name="dr-lab", provider="ansible", hosts=lab.spec_hosts())
        spec["server"]["binary"] = server_binary("valkey")
        s, s_loaded = stack.enter_context(applied(tmp_path / "standby", capsys, spec))
        standby = source_client(s_loaded)
        assert s_loaded.layout.servers[0].address == lab.hosts[0].address  # on the lab host, not here
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            standby.set("client-write", "1")  # applied fenced
        writer = stack.enter_context(Writer(lambda: source_client(p_loaded)))
        writer.wait_for_writes(100)
        follow = Follow(s)
        stack.callback(lambda: follow.proc.poll() is None and follow.proc.kill())
        follow.streaming()
        writer.wait_for_more(200)
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "cutover done" in out, out + err
        assert follow.wait() == 0, follow.stderr()
        writer.wait_for_refusal()  # the old primary refuses writes (NOREPLICAS)
        writer.stop()
        assert writer.verify(standby) == []  # every acknowledged write on the lab's standby
        assert standby.set("after", "1") and standby.get("after") == "1"  # it takes writes
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            source_client(p_loaded).set("after", "1")
        assert PASSWORD not in out + err + follow.stderr()
