"""HTTP/2, sans-IO (RFC 9113). One end of a connection is one :class:`~.connection.Connection` (bytes
in, events and frames out), holding its collaborators: the flow-control windows (windows.py), the
output for the I/O layer (output.py) and the peer's header blocks as they arrive (blocks.py, with
HPACK in hpackcache.py). Pure beneath them: the stream table and a stream's state (streams.py, §5.1),
frames (frames.py), and what a stream may carry and the connection's bounds (rules.py)."""
