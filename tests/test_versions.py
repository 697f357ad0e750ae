from opsctl.server.versions import has_capability, has_directive, rolling_change_problem


def test_directives_follow_the_version_table() -> None:
    assert has_directive("valkey", (9, 1), "hide-user-data-from-log")
    assert not has_directive("redis", (7, 0), "hide-user-data-from-log")
    assert has_directive("redis", (7, 0), "maxmemory")


def test_capabilities() -> None:
    assert has_capability("valkey", (9, 1), "atomic_slot_migration")
    assert not has_capability("redis", (7, 0), "atomic_slot_migration")


def test_upgrades_that_keep_replication_are_allowed() -> None:
    assert rolling_change_problem(("redis", (7, 0)), ("valkey", (9, 1))) is None
    assert rolling_change_problem(("redis", (7, 0)), ("redis", (7, 2))) is None
    assert rolling_change_problem(("valkey", (9, 1)), ("valkey", (9, 1))) is None


def test_downgrades_and_dead_ends_are_refused_with_the_reason() -> None:
    problem = rolling_change_problem(("valkey", (9, 1)), ("redis", (7, 0)))
    assert problem is not None and "RDB format 80" in problem
    assert rolling_change_problem(("redis", (7, 4)), ("valkey", (9, 1))) is not None
