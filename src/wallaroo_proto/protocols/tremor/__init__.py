"""The Tremor network protocol (RFC 0019 and its companions): JSON control plane over WebSocket.

``messages`` turns a text message into a control-plane or stream message
(and back), ``wsframes`` reads WebSocket frames and the HTTP upgrade passively
out of a capture, ``core`` judges one session (sans-IO), ``node`` is the
sans-IO server logic (sessions, echo, pub/sub broker), ``peers`` runs the
mock node and client over wsproto and asyncio/sockets. Nothing here imports
another protocol's modules.
"""
