"""`follows:` (issue 36): each wrong shape refused with its file:line and a hint, endpoints with the words of
`migrate --from-endpoints` (a login in one is never echoed back)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from opsctl.base.errors import SpecError
from opsctl.migrate.foreign import parse_endpoints
from opsctl.spec.validate import validated_spec

BASE: dict[str, Any] = {"name": "orders-dr", "topology": "standalone",
                        "hosts": [{"name": "h1", "address": "127.0.0.2"}], "auth": {"password": {"env": "ORDERS_PW"}}}


def _problems(follows: dict[str, Any]) -> list[tuple[int | None, str, str, str]]:
    def resolve(ref: Any) -> str | None:
        return "a-long-enough-password" if ref.env == "ORDERS_PW" else None

    with pytest.raises(SpecError) as caught:
        validated_spec(yaml.safe_dump({**BASE, "follows": follows}, sort_keys=False), "dr.yaml", resolve)
    return [(p.line, p.field, p.message, p.hint) for p in caught.value.problems]


def test_a_primary_by_spec_is_accepted() -> None:
    spec = validated_spec(yaml.safe_dump({**BASE, "follows": {"spec": "orders.yaml"}}), "dr.yaml",
                          lambda ref: "a-long-enough-password")
    assert spec.follows is not None and spec.follows.spec == "orders.yaml"


@pytest.mark.parametrize(("follows", "field", "says"), [
    ({}, "follows", "give exactly one of spec"),
    ({"spec": "a.yaml", "endpoints": ["h:1"], "password": {"env": "X"}}, "follows", "give exactly one of spec"),
    ({"spec": "a.yaml", "password": {"env": "ORDERS_PW"}}, "follows", "go with endpoints"),
    ({"endpoints": ["10.0.0.5:6380"]}, "follows", "endpoints need password"),
    ({"spec": "a.yaml", "tls": {"ca": {"file": "ca.crt"}}}, "follows", "go with endpoints"),
    ({"endpoints": ["h:1"], "password": {"env": "ORDERS_PW"}, "tls": {"ca": {"file": "c"}, "cert": {"file": "x"}}},
     "follows.tls", "cert and key together"),
    ({"endpoints": ["h:70000"], "password": {"env": "ORDERS_PW"}}, "follows.endpoints[0]", "a number from 1 to 65535"),
    ({"endpoints": ["h:1", "nope"], "password": {"env": "ORDERS_PW"}}, "follows.endpoints[1]", "is not HOST:PORT"),
    ({"endpoints": ["h:1"], "password": {"env": "UNSET_PW_VAR"}}, "follows.password", "not found"),
    ({"endpoints": ["h:1"], "password": {"env": "ORDERS_PW"}, "user": "a b"}, "follows.user", ""),
])
def test_each_wrong_shape_is_located(follows: dict[str, Any], field: str, says: str) -> None:
    problems = _problems(follows)
    assert any(f == field and says in message and line for line, f, message, _ in problems), problems
    assert all(hint for _, f, _, hint in problems if f not in ("follows.tls", "follows.user")), problems


def test_a_login_in_an_endpoint_is_never_echoed() -> None:
    problems = _problems({"endpoints": ["mover:s3cret-pw@10.0.0.5:6380"], "password": {"env": "ORDERS_PW"}})
    assert problems and "holds a login" in problems[0][2] and "s3cret" not in repr(problems)
    with pytest.raises(Exception) as caught:  # the same words as migrate --from-endpoints
        parse_endpoints("mover:s3cret-pw@10.0.0.5:6380")
    assert "holds a login" in str(caught.value) and "s3cret" not in str(caught.value)


def test_a_migration_into_a_standby_is_refused(tmp_path, capsys) -> None:
    from tests.lifecycle import run
    from tests.support import make_spec, write_spec

    path = write_spec(tmp_path, make_spec("standalone", "valkey", hosts=1, follows={"spec": "primary.yaml"}))
    code, out, err = run(capsys, "migrate", "-f", str(path), "--from", str(path), "--auto-approve")
    assert code == 1 and "is a standby" in err and "opsctl follow -f" in err, out + err
