"""Native cluster operations (no redis-cli): primitives and cluster creation."""
