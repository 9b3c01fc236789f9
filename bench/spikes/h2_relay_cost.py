"""The gRPC listener's library choice, measured: Python CPU to relay one 64-byte gRPC message.

Two ways to relay a server-streaming call's messages from the model server's connection to the
client's, without sockets (only the Python each way costs):

- ``h2`` 4.4.1 (python-hyper/h2) state machines, one per connection, as a relay built on it would run
  them: receive the DATA frame, send it on the other connection, acknowledge it, and take the
  client's WINDOW_UPDATE back;
- frames passed through: parse the 9-byte header, rewrite the stream id, keep the payload (what
  ``drain_router.grpc`` does).

Run: ``pip install h2==4.4.1 && python bench/spikes/h2_relay_cost.py`` (h2 is not a dependency).
"""

from __future__ import annotations

import struct
import time

N = 20_000
MESSAGE = b"\x00" + struct.pack(">I", 59) + b"x" * 59  # a 64-byte gRPC message


def h2_relay() -> float:
    import h2.config
    import h2.connection
    import h2.events
    from hyperframe.frame import DataFrame

    def pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
        server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        client.initiate_connection()
        server.initiate_connection()
        server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())
        server.receive_data(client.data_to_send())
        return server, client

    upstream, router_up = pair()  # the model server, and the router as its client
    router_down, client = pair()  # the router as the client's server, and the client
    request = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/x.Y/Z"), (b":authority", b"a")]
    response = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    client.send_headers(1, request)
    router_down.receive_data(client.data_to_send())
    router_up.send_headers(1, request)
    upstream.receive_data(router_up.data_to_send())
    upstream.send_headers(1, response)
    router_up.receive_data(upstream.data_to_send())
    router_down.send_headers(1, response)
    client.receive_data(router_down.data_to_send())
    for conn in (upstream, router_up, router_down, client):
        conn.data_to_send()
    frame = DataFrame(1)
    frame.data = MESSAGE
    wire = frame.serialize()
    spent = 0.0
    for _ in range(N):
        start = time.perf_counter()
        for event in router_up.receive_data(wire):
            if isinstance(event, h2.events.DataReceived):
                router_down.send_data(1, event.data)
                router_up.acknowledge_received_data(event.flow_controlled_length, 1)
        out = router_down.data_to_send()
        router_up.data_to_send()
        spent += time.perf_counter() - start
        for event in client.receive_data(out):  # the client's side is not the router's cost
            if isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, 1)
        back = client.data_to_send()
        start = time.perf_counter()
        router_down.receive_data(back)
        spent += time.perf_counter() - start
    return spent / N


def pass_through() -> float:
    wire = struct.pack(">I", (len(MESSAGE) << 8) | 0) + b"\x00" + (1).to_bytes(4, "big") + MESSAGE
    header = struct.Struct(">IBI")
    windows: dict[int, int] = {}
    start = time.perf_counter()
    for _ in range(N):
        length_type, flags, stream = header.unpack_from(wire, 0)
        length = length_type >> 8
        out = header.pack(length_type, flags, 7) + wire[9 : 9 + length]
        windows[stream] = windows.get(stream, 65535) - length
        del out
    return (time.perf_counter() - start) / N


if __name__ == "__main__":
    print(f"h2 state machines: {h2_relay() * 1e6:.2f} us per relayed message")
    print(f"frames passed through: {pass_through() * 1e6:.2f} us per relayed message")
