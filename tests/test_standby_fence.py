"""A standby's write fence (issue 36, docs/standby.md): `apply` of a spec with `follows:` deploys servers that refuse
their clients' writes (NOPERM, a script's included) while opsctl's follower user writes; plan and apply say the spec
is a standby; a spec that follows itself or a standby of itself is refused by name, before anything is deployed."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from opsctl.render.exporteruser import FOLLOWER_USER, follower_secret
from tests.lifecycle import applied, run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

pytestmark = pytest.mark.integration
FENCED = r"(?i)no permissions|can.t run this command"  # NOPERM; a script's: the server's own words


def _primary(tmp_path: Path) -> Path:
    """A primary's spec (not deployed: the fence is the standby's own)."""
    folder = tmp_path / "primary"
    folder.mkdir()
    return write_spec(folder, make_spec("standalone", "valkey", hosts=1))


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
@pytest.mark.parametrize("mode", ["password", "acl"])
def test_a_standby_refuses_client_writes_and_its_follower_writes(tmp_path, capsys, flavor, mode) -> None:
    primary = _primary(tmp_path)
    auth = {"mode": mode, "password": {"env": PASSWORD_ENV}}
    if mode == "acl":
        auth["users"] = [{"name": "app", "password": {"env": PASSWORD_ENV}}]
    spec = make_spec("standalone", flavor, hosts=1, auth=auth, follows={"spec": str(primary)})
    folder = tmp_path / "standby"
    folder.mkdir()
    with applied(folder, capsys, spec) as (path, loaded):
        node = loaded.layout.servers[0]
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD,
                             username="app" if mode == "acl" else None)
        for write in (lambda: client.set("k", "v"), lambda: client.eval("return redis.call('SET', 'k', 'v')", 0),
                      lambda: client.incr("n")):
            with pytest.raises(redis.exceptions.ResponseError, match=FENCED):
                write()
        assert client.get("k") is None and client.ping()  # reads and the rest still served
        follower = redis.Redis(host=node.address, port=node.port, username=FOLLOWER_USER,
                               password=follower_secret(loaded).reveal())
        assert follower.set("k", "v") and follower.eval("return redis.call('INCR', 'n')", 0) == 1
        assert client.get("k") == b"v"
        code, _, err = run(capsys, "plan", "-f", str(path))
        assert code == 0 and f"'{loaded.spec.name}' is a standby of {primary}" in err, err


def test_a_standby_of_itself_or_of_its_own_standby_is_refused(tmp_path, capsys) -> None:
    own = make_spec("standalone", "valkey", hosts=1)
    path = write_spec(tmp_path, {**own, "follows": {"spec": "topology.yaml"}})
    code, out, err = run(capsys, "plan", "-f", str(path))
    assert code == 1 and f"'{own['name']}' follows itself" in err, out + err
    other = make_spec("standalone", "valkey", hosts=1)
    back = write_spec(tmp_path, {**other, "follows": {"spec": "topology.yaml"}}, "other.yaml")
    path.write_text(path.read_text().replace("topology.yaml", "other.yaml"))
    code, out, err = run(capsys, "apply", "-f", str(path), "--auto-approve")
    assert code == 1 and f"which follows '{own['name']}' back: a cycle" in err, out + err
    assert not (tmp_path / ".opsctl" / own["name"]).exists() or not any((tmp_path / ".opsctl" / own["name"]).glob(
        f"{own['name']}-*")), "nothing deployed"
    assert back.exists()
    own_endpoint = f"{own['hosts'][0]['address']}:{own['standalone']['port']}"
    path.write_text(path.read_text().replace("spec: other.yaml", f"endpoints: ['{own_endpoint}']\n  password: "
                                             f"{{env: {PASSWORD_ENV}}}"))
    code, out, err = run(capsys, "plan", "-f", str(path))
    assert code == 1 and "follows itself: follows.endpoints names its own servers" in err, out + err


@pytest.mark.parametrize(("flavor", "mode"), [("valkey", "password"), ("redis", "acl")])
def test_a_running_site_made_a_standby_is_fenced_by_its_apply_first(tmp_path, capsys, flavor, mode) -> None:
    """The way back: follows: moved into the spec of a site that takes writes; its apply fences the running
    servers before any step (writing the files alone would leave them taking writes until a restart)."""
    primary = _primary(tmp_path)
    auth = {"mode": mode, "password": {"env": PASSWORD_ENV}}
    if mode == "acl":
        auth["users"] = [{"name": "app", "password": {"env": PASSWORD_ENV}}]
    folder = tmp_path / "site"
    folder.mkdir()
    with applied(folder, capsys, make_spec("standalone", flavor, hosts=1, auth=auth)) as (path, loaded):
        node = loaded.layout.servers[0]
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD,
                             username="app" if mode == "acl" else None)
        assert client.set("k", "before")
        path.write_text(path.read_text() + f"follows: {{spec: {primary}}}\n")
        code, out, err = run(capsys, "apply", "-f", str(path), "--auto-approve")
        assert code == 0 and f"fenced against client writes: {node.name}" in err, out + err
        with pytest.raises(redis.exceptions.ResponseError, match=FENCED):
            client.set("k", "after")
        assert client.get("k") == b"before"


def test_a_sentinel_standby_is_healthy_fenced_and_replicates_the_followers_writes(tmp_path, capsys) -> None:
    """Replicas and Sentinels log in as the default user too: the fence takes nothing they need (the apply's closing
    status is healthy), and what the follower writes reaches the replicas."""
    primary = _primary(tmp_path)
    folder = tmp_path / "standby"
    folder.mkdir()
    with applied(folder, capsys, make_spec("sentinel", "valkey", follows={"spec": str(primary)})) as (_, loaded):
        master = next(n for n in loaded.layout.servers if n.role == "master")
        client = redis.Redis(host=master.address, port=master.port, password=PASSWORD)
        with pytest.raises(redis.exceptions.ResponseError, match=FENCED):
            client.set("k", "v")
        follower = redis.Redis(host=master.address, port=master.port, username=FOLLOWER_USER,
                               password=follower_secret(loaded).reveal())
        assert follower.set("k", "v") and follower.wait(2, 10_000) == 2
        for replica in (n for n in loaded.layout.servers if n.role == "replica"):
            assert redis.Redis(host=replica.address, port=replica.port, password=PASSWORD).get("k") == b"v"
        code, out, err = run(capsys, "status", "-f", str(folder / "topology.yaml"))
        assert code == 0 and follower_secret(loaded).reveal() not in out + err, out + err
