"""Admission control (``--max-concurrent-requests``): the gate (its slots and its bounded queue) that
HTTP/1.1 requests, WebSocket handshakes and gRPC calls share, and the ticket one request holds."""
