"""Rendering is safe even when validation misses a field: every printed value passes one check (no control
characters), free text becomes one quoted argument, and the files do not depend on the spec's path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from opsctl.render import default_paths, render_node
from opsctl.render.tokens import UnsafeValue, quoted, word
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver
from opsctl.spec.model import Spec
from opsctl.spec.text import split_args
from tests.test_render_golden import GOLDEN, SECRETS

INJECTIONS = ["10\nrequirepass \"\"", "x\r\nenable-debug-command yes", "a\x00b", "a\u2028b", "a\x85b"]


def loaded_case(case: str, file: str = "spec.yaml") -> LoadedSpec:
    text = (GOLDEN / case / "spec.yaml").read_text()
    return load_spec(text, file, make_resolver(SECRETS, lambda _name: None))


def with_spec(loaded: LoadedSpec, **update: Any) -> LoadedSpec:
    """The spec changed without validation, as if a check had missed a field."""
    return dataclasses.replace(loaded, spec=loaded.spec.model_copy(update=update))


def render_all(loaded: LoadedSpec, reveal: bool = True) -> dict[str, str]:
    files = {}
    for node in loaded.layout.nodes:
        paths = default_paths("/var/lib/opsctl/x", node)
        for name, text in render_node(loaded, node, paths, reveal=reveal).files.items():
            files[f"{node.name}/{name}"] = text
    return files


def directive_names(files: dict[str, str]) -> dict[str, list[str]]:
    """Per file, the first word of every line that is not a comment: what the server's parser acts on."""
    return {rel: [line.split()[0] for line in text.split("\n") if line.strip() and not line.startswith("#")]
            for rel, text in files.items()}


def hardening(spec: Spec, **update: Any) -> Any:
    return spec.hardening.model_copy(update=update)


@pytest.mark.parametrize("bad", INJECTIONS)
def test_config_value_with_control_character_is_refused(bad: str) -> None:
    loaded = loaded_case("standalone-valkey-password")
    with pytest.raises(UnsafeValue, match="control character"):
        render_all(with_spec(loaded, config={"hz": bad}))


@pytest.mark.parametrize("bad", INJECTIONS[:2])
def test_every_kind_of_value_is_checked(bad: str) -> None:
    loaded = loaded_case("sentinel-valkey-acl")
    spec = loaded.spec

    def users(value: str) -> Any:
        return spec.auth.model_copy(update={"users": [spec.auth.users[0].model_copy(
            update={"rules": f"~app:* {value}"})]})

    makers = [
        lambda value: with_spec(loaded, config={"loadmodule": f"/x.so {value}"}),
        lambda value: with_spec(loaded, hardening=hardening(spec, renamed_commands={"CONFIG": value})),
        lambda value: with_spec(loaded, hardening=hardening(spec, disabled_commands=[value])),
        lambda value: with_spec(loaded, auth=users(value)),
        lambda value: with_spec(loaded, auth=spec.auth.model_copy(update={"admin_user": value})),
        lambda value: with_spec(loaded, name=value),
    ]
    for make in makers:
        assert_one_line_each(lambda value, make=make: render_all(make(value)), bad)
    node = loaded.layout.servers[0]
    for field in ("dir", "conf", "acl", "log", "pid"):
        def with_path(value: str, field: str = field) -> dict[str, str]:
            paths = dataclasses.replace(default_paths("/var/lib/opsctl/x", node), **{field: f"/tmp/{value}"})
            return render_node(loaded, node, paths, reveal=True).files
        assert_one_line_each(with_path, bad)
    assert_one_line_each(lambda value: render_node(loaded, dataclasses.replace(node, address=value, bind=(value,)),
                                                   default_paths("/x", node)).files, bad)
    sentinel = loaded.layout.sentinels[0]
    assert_one_line_each(lambda value: render_node(loaded, sentinel, default_paths("/x", sentinel),
                                                   master=(value, 7000)).files, bad)


def assert_one_line_each(render: Callable[[str], dict[str, str]], bad: str) -> None:
    """Rendering with bad either refuses or writes exactly the lines a harmless value writes."""
    clean = directive_names(render("harmless"))
    try:
        rendered = render(bad)
    except UnsafeValue:
        return
    assert directive_names(rendered) == clean, "a value wrote an extra line"


def test_unbalanced_quotes_are_refused() -> None:
    loaded = loaded_case("standalone-valkey-password")
    with pytest.raises(UnsafeValue, match="unbalanced quotes"):
        render_all(with_spec(loaded, config={"notify-keyspace-events": '"KEA'}))


@pytest.mark.parametrize("text", ["plain", "", "with space", 'qu"ote', "back\\slash", "#hash", "'single",
                                  "new\nline", "tab\there", "nul\x00", "\u2028", "é"])
def test_word_and_quoted_parse_back_as_one_argument(text: str) -> None:
    for token in (word(text), quoted(text)):
        assert "\n" not in token and "\r" not in token
        (got,) = split_args(token)
        assert got == text or got.encode("latin-1") == text.encode(), "\\xHH escapes are bytes to the server"


def test_paths_with_spaces_are_one_argument() -> None:
    loaded = loaded_case("standalone-valkey-acl")
    node = loaded.layout.nodes[0]
    conf = render_node(loaded, node, default_paths("/srv/my data", node)).files["redis.conf"]
    lines = {split_args(line)[0]: split_args(line)[1:] for line in conf.splitlines() if line and line[0] != "#"}
    assert lines["dir"] == ["/srv/my data/stan-va-acl-1"]
    assert lines["aclfile"] == ["/srv/my data/stan-va-acl-1/users.acl"]


def test_acl_rules_are_written_argument_by_argument() -> None:
    loaded = loaded_case("standalone-valkey-acl")
    users = [loaded.spec.auth.users[0].model_copy(update={"rules": '"~my key:*" +@read'})]
    loaded = with_spec(loaded, auth=loaded.spec.auth.model_copy(update={"users": users}))
    acl = render_all(loaded)["stan-va-acl-1/users.acl"]
    app = next(split_args(line) for line in acl.splitlines() if line.startswith("user app "))
    assert app[4:6] == ["~my key:*", "+@read"]


def test_rendered_files_do_not_depend_on_the_spec_path() -> None:
    """Issue 14 case 6: the same spec renders the same files (and so the same plan digest) from any path."""
    for case in ("cluster-valkey-acl", "sentinel-redis-password"):
        spellings = ["spec.yaml", "./spec.yaml", "/abs/checkout/spec.yaml", "../other/copy.yaml"]
        rendered = [render_all(loaded_case(case, file), reveal=False) for file in spellings]
        assert all(files == rendered[0] for files in rendered[1:])


@pytest.mark.parametrize("text", ['Qu"ote\\back$lash#x\'y!{}', 'x\\"', '\\\\"', "plain", 'a"b"c', "tab\there"])
def test_unquote_reads_quoted_back_exactly(text: str) -> None:
    """CONFIG SET sends the raw value of a quoted directive (a password full of quoting hazards)."""
    from opsctl.plan.desired import unquote

    assert unquote(quoted(text)) == text
