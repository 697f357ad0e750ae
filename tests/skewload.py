"""A skewed load for `cluster rebalance --by ...`: most operations on a few slots of one master, the rest spread
over every slot. Keys are picked by slot (a hash tag per slot), so the test knows which slots are hot."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster

TAGS = 60000  # hash tags tried to find a key for slots (each slot gets one with high probability)


def tags_by_slot(client: RedisCluster) -> dict[int, str]:
    """One hash tag per slot: `{t<i>}` whose slot is that slot (the first found)."""
    found: dict[int, str] = {}
    for i in range(TAGS):
        found.setdefault(client.keyslot(f"{{t{i}}}"), f"{{t{i}}}")
    return found


def slots_of(client: RedisCluster, endpoint: str, tags: dict[int, str]) -> list[int]:
    """The slots (among tags') the master at endpoint serves now, in slot order."""
    client.nodes_manager.initialize()
    mine = []
    for slot in sorted(tags):
        node = client.nodes_manager.get_node_from_slot(slot)
        if f"{node.host}:{node.port}" == endpoint:
            mine.append(slot)
    return mine


@dataclass
class SkewLoad:
    """`with SkewLoad(make_client, hot_keys, cold_keys, 0.85):` GET/SET in a thread, hot_share of them on hot_keys."""

    client: Any
    hot_keys: Sequence[str]
    cold_keys: Sequence[str]
    hot_share: float = 0.85
    ops: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SkewLoad:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        rng = random.Random(37)
        value = "x" * 200
        while not self._stop.is_set():
            keys = self.hot_keys if rng.random() < self.hot_share else self.cold_keys
            key = rng.choice(keys)
            try:
                self.client.set(key, value) if rng.random() < 0.5 else self.client.get(key)
                self.ops += 1
            except Exception:  # a slot moving under the load: the writer referees data, this only loads
                continue
