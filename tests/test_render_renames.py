"""Password mode renames the takeover commands by default (issue 11 item 15): names opsctl derives the same way on
every run, that opsctl's clients (LoadedSpec.command_name), redis.conf and sentinel.conf agree on."""

from __future__ import annotations

import dataclasses

import pytest

from opsctl.base.secrets import Secret
from opsctl.spec.load import TAKEOVER_COMMANDS, command_renames
from tests.support import admin_for
from tests.test_render_safety import loaded_case


def test_password_mode_renames_the_takeover_commands_stably() -> None:
    loaded = loaded_case("standalone-valkey-password")
    renames = loaded.renames
    assert set(TAKEOVER_COMMANDS) <= set(renames)
    assert renames == loaded_case("standalone-valkey-password", "/elsewhere/copy.yaml").renames, "stable"
    derived = {c: n for c, n in renames.items() if c not in loaded.spec.hardening.renamed_commands}
    assert all(n.startswith(f"OPS_{c}_") and len(n) == len(f"OPS_{c}_") + 16 for c, n in derived.items())
    other = loaded.spec.model_copy(update={"name": "another"})
    assert command_renames(other, None)["SHUTDOWN"] != renames["SHUTDOWN"], "each spec its own names"
    keyed = command_renames(loaded.spec, Secret("a-rename-key-from-a-secret"))
    assert keyed["SHUTDOWN"] != renames["SHUTDOWN"], "rename_key: names not derivable from the spec"
    assert keyed["CONFIG"] == "OPS_CONFIG_G0LD", "the spec's own renames win"


def test_disabled_commands_stay_disabled_and_acl_mode_renames_only_what_the_spec_says() -> None:
    loaded = loaded_case("standalone-valkey-password")
    hardening = loaded.spec.hardening.model_copy(update={"disabled_commands": ["FLUSHALL", "SHUTDOWN"]})
    renames = command_renames(loaded.spec.model_copy(update={"hardening": hardening}), None)
    assert "SHUTDOWN" not in renames
    acl = loaded_case("standalone-valkey-acl")
    assert acl.renames == {k.upper(): v for k, v in acl.spec.hardening.renamed_commands.items()}
    off = loaded.spec.hardening.model_copy(update={"rename_takeover_commands": False})
    assert set(command_renames(loaded.spec.model_copy(update={"hardening": off}), None)) == {"CONFIG", "REPLICAOF"}


def test_rendered_files_and_admin_use_the_same_names() -> None:
    from opsctl.render import default_paths, render_node

    loaded = loaded_case("sentinel-redis-password")
    server, sentinel = loaded.layout.servers[0], loaded.layout.sentinels[0]
    conf = render_node(loaded, server, default_paths("/x", server)).files["redis.conf"]
    watch = render_node(loaded, sentinel, default_paths("/x", sentinel)).files["sentinel.conf"]
    admin = admin_for(loaded, server)
    for command in TAKEOVER_COMMANDS:
        assert f"rename-command {command} {admin.command(command)}\n" in conf
        assert f"sentinel rename-command {loaded.spec.name} {command} {admin.command(command)}\n" in watch
    admin.close()


def test_rename_key_is_a_secret_of_the_spec() -> None:
    loaded = loaded_case("standalone-valkey-password")
    keyed = dataclasses.replace(loaded, credentials=dataclasses.replace(loaded.credentials,
                                                                        rename_key=Secret("k3y-k3y-k3y-k3y")))
    assert keyed.credentials.rename_key in keyed.credentials.all(), "masked in output like every secret"


@pytest.mark.integration
def test_a_client_with_the_password_cannot_take_a_node_over(tmp_path, capsys) -> None:
    """Live, password mode: the takeover commands are unknown under their own names, opsctl still runs them."""
    import redis

    from tests.lifecycle import deployed, plan_json
    from tests.support import PASSWORD

    with deployed(tmp_path, capsys, "replication", "redis", hosts=2) as (spec, loaded):
        replica = loaded.layout.servers[1]
        client = redis.Redis(host=replica.address, port=replica.port, password=PASSWORD)
        attempts = [("REPLICAOF", "127.0.0.1", "1"), ("SLAVEOF", "127.0.0.1", "1"), ("SHUTDOWN", "NOSAVE"),
                    ("ACL", "SETUSER", "evil", "on", ">evil-password-123", "+@all", "~*"),
                    ("MIGRATE", "127.0.0.1", "1", "", "0", "100", "KEYS", "k"), ("FAILOVER",),
                    ("CONFIG", "SET", "bind", "0.0.0.0")]
        for attempt in attempts:
            try:
                client.execute_command(*attempt)
            except redis.ResponseError as exc:
                assert "unknown command" in str(exc).lower(), (attempt, exc)
            else:
                raise AssertionError(f"{attempt[0]} ran under its own name")
        client.close()
        assert plan_json(capsys, spec)["steps"] == [], "the derived names are the same on the next run"

        with admin_for(loaded, replica) as admin:
            assert admin.call("ROLE")[0] == "slave"
            assert admin.call("ACL", "WHOAMI") == "default" and admin.config_get("port")["port"] == str(replica.port)
