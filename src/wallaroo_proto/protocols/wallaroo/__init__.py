"""The Wallaroo connector protocol v3 as a dissector plug-in (its codec and core are the package's)."""
