"""opsctl.restore.functions.library_conflicts: which function libraries would stop a copy part-way (pure)."""

from __future__ import annotations

from opsctl.restore.functions import library_conflicts


def test_the_same_code_everywhere_is_no_conflict() -> None:
    same = {b"shop": b"code-1"}
    assert library_conflicts({"shard-1": same, "shard-2": same}, {"t-1": same, "t-2": {}}) == []
    assert library_conflicts({"shard-1": {}}, {"t-1": {b"shop": b"other"}}) == []  # the source has none of it


def test_sources_that_disagree_are_named_with_the_first_one_holding_it() -> None:
    sources = {"shard-1": {b"shop": b"a"}, "shard-2": {b"shop": b"a"}, "shard-3": {b"shop": b"b", b"x": b"1"}}
    assert library_conflicts(sources, {}) == ["the function library 'shop' differs between shard-1 and shard-3"]


def test_a_target_holding_other_code_is_named() -> None:
    problems = library_conflicts({"shard-1": {b"shop": b"a", b"cart": b"c"}},
                                 {"t-1": {b"shop": b"a"}, "t-2": {b"shop": b"z", b"cart": b"other"}})
    assert problems == ["the function library 'shop' differs between shard-1 and t-2",
                        "the function library 'cart' differs between shard-1 and t-2"]
