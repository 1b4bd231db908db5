"""``fuzz``: protocol-aware stateful fuzzing of a live peer, the protocol's core as the oracle."""
