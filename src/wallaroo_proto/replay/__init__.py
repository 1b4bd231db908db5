"""Replay: one side of a recorded conversation played against a live peer, and two recordings compared.

The shared machinery, protocol-agnostic: ``recording`` reads the conversation a capture
holds (frames, their records and their bytes), ``compare`` matches and compares frames,
``links`` opens the live connections, ``live`` dissects and records what went over them,
``engine`` plays. Each protocol brings an ``adapter`` (its plug-in's ``replay_adapter``):
how a recorded frame follows the live peer's values, and which fields may differ.
"""
