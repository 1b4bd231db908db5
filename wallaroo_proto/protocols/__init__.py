"""Protocols beside Wallaroo's: one self-contained package each."""
