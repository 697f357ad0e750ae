"""Slot operations: reshard, rebalance, scale out/in, fix. The pure modules (ranges, balance, coverage, slotplan,
members, batching, moveguard) stand next to the I/O: the engines (reshard, keys, atomic), fix, session, journal."""
