"""The Kinesis MultiLangDaemon protocol: the KCL daemon and its record processors.

``codec`` turns bytes into lines and lines into messages, ``core`` judges a
shard's conversation (sans-IO), ``daemon`` and ``processor`` are the asyncio
mock peers, ``leases`` the daemon's durable checkpoints and ``records`` its
record sources. Nothing here imports the Wallaroo protocol's modules.
"""
