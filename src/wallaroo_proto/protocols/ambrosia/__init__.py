"""AMBROSIA's IC <-> language binding protocol: codec, sans-IO rules, mock IC and LB, dissector plug-in."""
