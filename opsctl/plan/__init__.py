"""Plans: ordered, typed, serialisable steps computed from a spec and the observed state. Pure."""
