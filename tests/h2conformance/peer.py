"""h2spec's client connection, over :class:`tests.h2client.RawClient`: its handshake, its reading of
the server's frames one event at a time, its flow-control bookkeeping, and its verdicts.

Each verdict mirrors one of h2spec's ``spec/verifier.go`` (summerwind/h2spec), acceptance rules
included (``VerifyConnectionError`` is :meth:`Peer.connection_error`, and so on):

- ``connection_error(codes)``: GOAWAY with one of ``codes``, or the connection closed. A GOAWAY with
  another code does not end the wait (the close that follows it passes, as in h2spec).
- ``stream_error(codes)``: the same, and RST_STREAM (on any stream) with one of ``codes``.
- ``connection_close``: only the connection closed.
- ``stream_close``: DATA or HEADERS with END_STREAM, or RST_STREAM NO_ERROR.
- ``headers_frame(sid)``, ``settings_ack``, ``ping_ack(data)``, ``event_type(kind)``, and the checks
  some cases make themselves (``data_length``, ``goaway_code``, ``rst_stream_code``): the first frame
  of that type (other frames are skipped) must be the one named; a close or the deadline fails.
- ``ping_ack_or_close(data)``: the PING ACK with ``data``, or the connection closed.

Where h2spec fails a test at its read timeout (2 s per read), a verdict here waits for the event
itself until :data:`DEADLINE`, and fails then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hyperframe import frame as hf

from tests.h2client import RawClient

#: How long a verdict waits for its event (h2spec's default timeout is 2 s per read).
DEADLINE = 3.0
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384

# Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Error codes (§7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
# Settings (§6.5.2).
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

CODES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 5: "STREAM_CLOSED"}
CODES |= {6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR", 11: "ENHANCE_YOUR_CALM"}

_KINDS = {
    DATA: hf.DataFrame,
    HEADERS: hf.HeadersFrame,
    PRIORITY: hf.PriorityFrame,
    RST_STREAM: hf.RstStreamFrame,
    SETTINGS: hf.SettingsFrame,
    PUSH_PROMISE: hf.PushPromiseFrame,
    PING: hf.PingFrame,
    GOAWAY: hf.GoAwayFrame,
    WINDOW_UPDATE: hf.WindowUpdateFrame,
    CONTINUATION: hf.ContinuationFrame,
}


class Closed:
    """The connection closed (EOF or reset): h2spec's ConnectionClosedEvent."""

    def __repr__(self) -> str:
        return "connection closed"


class Timeout:
    def __repr__(self) -> str:
        return f"nothing within {DEADLINE} s"


CLOSED = Closed()
TIMEOUT = Timeout()


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    """One frame, bytes as given (h2spec's WriteRawFrame): nothing is checked."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def describe(event: Any) -> str:
    if isinstance(event, hf.GoAwayFrame):
        return f"GOAWAY({CODES.get(event.error_code, event.error_code)}, last={event.last_stream_id})"
    if isinstance(event, hf.RstStreamFrame):
        return f"RST_STREAM({event.stream_id}, {CODES.get(event.error_code, event.error_code)})"
    if isinstance(event, hf.Frame):
        name = type(event).__name__.removesuffix("Frame").upper()
        flags = ",".join(sorted(event.flags))
        size = f", length={event.body_len}" if isinstance(event, hf.DataFrame) else ""
        return f"{name}(stream={event.stream_id}{', ' + flags if flags else ''}{size})"
    return repr(event)


class Verdict(AssertionError):
    """A case failed: what h2spec expects and what came instead."""

    def __init__(self, expected: str, actual: Any, peer: Peer) -> None:
        seen = ", ".join(describe(e) for e in peer.events[-12:])
        super().__init__(f"expected {expected}; got {describe(actual)} (events: {seen or 'none'})")


@dataclass
class Peer(RawClient):
    """A RawClient read the way h2spec reads: one event at a time, in order."""

    cursor: int = 0
    events: list[Any] = field(default_factory=list)
    """What the verdicts consumed, in order (for failure messages)."""
    server_settings: dict[int, int] = field(default_factory=dict)
    windows: dict[int, int] = field(default_factory=dict)
    error: BaseException | None = None
    """A frame from the server that could not be parsed (a failure, never a close)."""
    exact_codes: bool = False
    """Stricter than h2spec: a GOAWAY must carry a code the verdict expects (h2spec passes a GOAWAY
    with another code once the connection closes after it)."""

    async def _read(self) -> None:
        try:
            await super()._read()
        except Exception as exc:  # recorded: the reader has marked the connection closed
            self.error = exc

    @classmethod
    async def open(cls, port: int, *, preface: bool = True) -> Peer:
        """Connect; with ``preface``, h2spec's handshake: preface and SETTINGS(INITIAL_WINDOW_SIZE
        65535), then both the server's SETTINGS (acknowledged) and the ACK of ours are read."""
        peer = await cls.connect(port, settings={INITIAL_WINDOW_SIZE: DEFAULT_WINDOW}, preface=preface)
        assert isinstance(peer, Peer)
        peer.auto_ping_ack = False  # h2spec answers no PING
        if preface:
            deadline = time.monotonic() + DEADLINE
            local = remote = False
            while not (local and remote):
                event = await peer.next_event(deadline)
                if not isinstance(event, hf.Frame):
                    raise Verdict("the server's SETTINGS and the ACK of ours (handshake)", event, peer)
                if isinstance(event, hf.SettingsFrame):
                    if "ACK" in event.flags:
                        local = True
                    else:
                        remote = True
                        peer.server_settings.update(event.settings)
            peer.events.clear()
        return peer

    async def next_event(self, deadline: float) -> Any:
        """The next frame from the server, or CLOSED, or TIMEOUT at ``deadline`` (h2spec's WaitEvent).
        A DATA frame is counted against the windows as it is taken (h2spec's updateWindowSize)."""
        try:
            await self.wait_for(
                lambda c: len(c.frames) > self.cursor or c.closed, max(0.0, deadline - time.monotonic())
            )
        except AssertionError:
            self.events.append(TIMEOUT)
            return TIMEOUT
        if len(self.frames) > self.cursor:
            event = self.frames[self.cursor].frame
            self.cursor += 1
            if isinstance(event, hf.DataFrame):
                self.count_window(event)
        elif self.error is not None:
            raise AssertionError(f"a frame from the server could not be parsed: {self.error!r}")
        else:
            event = CLOSED
        self.events.append(event)
        return event

    def count_window(self, data: hf.DataFrame) -> None:
        """h2spec's flow control as a receiver: each window starts at 65535 whatever was announced,
        and once a DATA frame takes it to 0 or below, WINDOW_UPDATE brings it back to 65535."""
        for sid in (data.stream_id, 0):
            window = self.windows.get(sid, DEFAULT_WINDOW) - data.flow_controlled_length
            if window <= 0:
                self.send_raw(frame(WINDOW_UPDATE, 0, sid, (DEFAULT_WINDOW - window).to_bytes(4, "big")))
                window = DEFAULT_WINDOW
            self.windows[sid] = window

    # -- verdicts (spec/verifier.go) ------------------------------------------------------------

    async def _until(self, expected: str, passes: Any) -> None:
        """Events until ``passes(event)``; a close (unless it passes) or the deadline fails."""
        deadline = time.monotonic() + DEADLINE
        while True:
            event = await self.next_event(deadline)
            if passes(event):
                return
            if event is CLOSED or event is TIMEOUT:
                raise Verdict(expected, event, self)

    def wrong_goaway(self, event: Any, codes: tuple[int, ...]) -> bool:
        return self.exact_codes and isinstance(event, hf.GoAwayFrame) and event.error_code not in codes

    async def connection_error(self, *codes: int) -> None:
        names = " or ".join(f"GOAWAY({CODES[c]})" for c in codes)
        await self._error(f"{names} or the connection closed", (hf.GoAwayFrame,), codes)

    async def stream_error(self, *codes: int) -> None:
        names = " or ".join(f"GOAWAY({CODES[c]}) or RST_STREAM({CODES[c]})" for c in codes)
        await self._error(f"{names} or the connection closed", (hf.GoAwayFrame, hf.RstStreamFrame), codes)

    async def _error(self, expected: str, kinds: tuple[type, ...], codes: tuple[int, ...]) -> None:
        """A frame of ``kinds`` with one of ``codes``, or the close (a wrong GOAWAY fails at once
        under :attr:`exact_codes`)."""
        await self._until(
            expected,
            lambda e: (
                self.refuse(expected, e)
                if self.wrong_goaway(e, codes)
                else e is CLOSED or (isinstance(e, kinds) and e.error_code in codes)
            ),
        )

    def refuse(self, expected: str, event: Any) -> bool:
        raise Verdict(expected + " (exactly: a GOAWAY with another code fails here)", event, self)

    async def connection_close(self) -> None:
        await self._until("the connection closed", lambda e: e is CLOSED)

    async def stream_close(self) -> None:
        await self._until(
            "the stream's end (END_STREAM, or RST_STREAM NO_ERROR)",
            lambda e: (
                (isinstance(e, (hf.DataFrame, hf.HeadersFrame)) and "END_STREAM" in e.flags)
                or (isinstance(e, hf.RstStreamFrame) and e.error_code == NO_ERROR)
            ),
        )

    async def ping_ack_or_close(self, data: bytes) -> None:
        await self._until(
            f"PING ACK {data!r} or the connection closed",
            lambda e: e is CLOSED or (isinstance(e, hf.PingFrame) and "ACK" in e.flags and e.opaque_data == data),
        )

    async def first(self, kind: int, expected: str) -> Any:
        """The first frame of type ``kind`` (h2spec's WaitEventByType); a close or the deadline fails."""
        want = _KINDS[kind]
        deadline = time.monotonic() + DEADLINE
        while True:
            event = await self.next_event(deadline)
            if isinstance(event, want):
                return event
            if event is CLOSED or event is TIMEOUT:
                raise Verdict(expected, event, self)

    async def event_type(self, kind: int) -> None:
        await self.first(kind, f"a {_KINDS[kind].__name__}")

    async def headers_frame(self, sid: int) -> None:
        expected = f"a HEADERS frame on stream {sid}"
        event = await self.first(HEADERS, expected)
        if event.stream_id != sid:
            raise Verdict(expected, event, self)

    async def settings_ack(self) -> None:
        event = await self.first(SETTINGS, "SETTINGS ACK")
        if "ACK" not in event.flags:
            raise Verdict("SETTINGS ACK", event, self)

    async def ping_ack(self, data: bytes) -> None:
        expected = f"PING ACK {data!r}"
        event = await self.first(PING, expected)
        if "ACK" not in event.flags or event.opaque_data != data:
            raise Verdict(expected, event, self)

    async def data_length(self, length: int) -> None:
        """The first DATA frame carries ``length`` octets (the flow-control cases)."""
        expected = f"DATA of length {length}"
        event = await self.first(DATA, expected)
        if event.flow_controlled_length != length:
            raise Verdict(expected, event, self)

    async def goaway_code(self, code: int) -> None:
        """The first GOAWAY carries ``code`` (a close alone does not pass: http2/6.9.1/2)."""
        expected = f"GOAWAY({CODES[code]})"
        event = await self.first(GOAWAY, expected)
        if event.error_code != code:
            raise Verdict(expected, event, self)

    async def rst_stream_code(self, sid: int, code: int) -> None:
        """The first RST_STREAM carries ``code`` if it is on ``sid`` (http2/6.9.1/3; h2spec lets a
        reset of another stream pass)."""
        expected = f"RST_STREAM({sid}, {CODES[code]})"
        event = await self.first(RST_STREAM, expected)
        if event.stream_id == sid and event.error_code != code:
            raise Verdict(expected, event, self)

    async def server_preface(self) -> None:
        """The server's very first frame is SETTINGS without ACK (http2/3.5/1, generic/1/1)."""
        event = await self.next_event(time.monotonic() + DEADLINE)
        if not (isinstance(event, hf.SettingsFrame) and "ACK" not in event.flags):
            raise Verdict("SETTINGS without ACK as the server's first frame", event, self)

    async def response_length(self, sid: int) -> int:
        """The DATA octets of the response on ``sid`` until its end (h2spec's ServerDataLength)."""
        total = 0
        deadline = time.monotonic() + DEADLINE
        while True:
            event = await self.next_event(deadline)
            if isinstance(event, hf.DataFrame) and event.stream_id == sid:
                total += event.flow_controlled_length
            if isinstance(event, (hf.DataFrame, hf.HeadersFrame)) and "END_STREAM" in event.flags:
                return total
            if event is CLOSED or event is TIMEOUT:
                raise Verdict("the whole response (to measure its length)", event, self)
