"""The gRPC listener: prior-knowledge HTTP/2 over cleartext (h2c), relayed stream by stream.

Read top-down: listener.py (accept, the drain's GOAWAY sequence, the deadline) -> inbound.py (one
client connection: streams admitted under the bounds) -> call.py (one relayed stream: in flight,
outcome, health answered by the router) -> pool.py (the upstream connections) -> outbound.py (one
connection to the model server) -> connection.py (what both ends share: frames in, flow control,
HPACK) -> frames.py, rules.py, health.py (pure: the wire format, the checks and bounds, the health
messages).
"""
