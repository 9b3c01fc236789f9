"""The gRPC relay: prior-knowledge HTTP/2 over cleartext (h2c), relayed stream by stream on top of
the sans-IO core in :mod:`drain_router.h2`: one :class:`~drain_router.h2.connection.Connection` for
each end, which connection.py feeds and writes out.

Read top-down: listener.py (accept, the drain's GOAWAY sequence, the deadline) -> inbound.py (one
client connection: streams admitted under the bounds) -> call.py (one relayed stream: in flight,
outcome) -> pool.py (the upstream connections) -> outbound.py (one connection to the model server)
-> connection.py (the asyncio Protocol both ends share). health.py answers ``grpc.health.v1``
itself; answers.py is what the router writes on a call it ends.
"""
