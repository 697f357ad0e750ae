"""Slot operations: reshard, rebalance, scale out/in, fix. Pure planning (ranges, balance, batching, journal
replay) next to the thin I/O engines (key-by-key and atomic migration)."""
