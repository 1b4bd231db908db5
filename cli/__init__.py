"""The wallaroo-proto command line: option parsing and rendering only."""
