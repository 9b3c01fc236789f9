"""gRPC load: clients calling vLLM's engine ``Generate`` (server streaming), for the demo and e2e.

The gRPC counterpart of :mod:`drain_router_dev.load`. :func:`generate` makes one call with the
``vllm.grpc.engine.VllmEngine`` stub and returns a :class:`CallResult` (never raises for a failed
call: its status is data); :func:`classify` says whether the call arrived whole, knowing what the
fake model sends: token ids 0, 1, ..., n-1 in ``chunk`` messages, then one ``complete`` with every
token and finish reason ``length``. :class:`GrpcLoad` runs clients back to back over one channel
(one HTTP/2 connection, as one application's gRPC client has) until told to stop, keeping a
:class:`Record` per call.

The channel is grpcio's default: retries on (no retry policy, so only gRPC's transparent retry of
a stream the server refused before it began, which REFUSED_STREAM and a GOAWAY's unprocessed
streams are), no wait-for-ready (a call with no connection fails at once with UNAVAILABLE).
Needs grpcio and smg-grpc-proto: the devtools distribution's dependencies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import random
import time
from typing import Any

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from drain_router_dev import workers

#: A call that has not ended by then is a lost one (its deadline, sent as ``grpc-timeout``).
DEFAULT_CALL_TIMEOUT_SECS = 15.0
#: After a call that got no token, the client waits this long before the next: a real one backs off.
FAILED_PAUSE_SECS = 0.02


class Outcome(str, enum.Enum):
    OK = "ok"
    """Status OK, the tokens 0..n-1 in order, then a ``complete`` with all of them (finish ``length``)."""
    FAILED = "failed"
    """A status other than OK before any message (UNAVAILABLE from a balancer, a refused stream...)."""
    CUT = "cut"
    """Some tokens, then a status other than OK (a reset, the router's deadline)."""
    INCOMPLETE = "incomplete"
    """Status OK, but tokens missing, repeated or out of order, or no ``complete`` agreeing with them."""
    LEFT = "left"
    """The client cancelled the call on purpose after some tokens (a user who gives up): not a loss."""

    @property
    def lost(self) -> bool:
        return self not in (Outcome.OK, Outcome.LEFT)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CallResult:
    code: str
    """The call's status code name (``OK``, ``UNAVAILABLE``...); ``CANCELLED`` for a client that left."""
    expected: int
    """How many tokens the call asked for (``max_tokens``)."""
    tokens: tuple[int, ...] = ()
    """The token ids of the ``chunk`` messages, in arrival order."""
    complete: tuple[int, ...] | None = None
    """The ``complete`` message's token ids, if one came."""
    finish_reason: str | None = None
    details: str | None = None
    """The status message of a call that did not end OK."""
    left: bool = False


def classify(result: CallResult) -> Outcome:
    """The outcome of one ``Generate`` call. Pure."""
    if result.left:
        return Outcome.LEFT
    if result.code != "OK":
        return Outcome.CUT if result.tokens or result.complete is not None else Outcome.FAILED
    whole = tuple(range(result.expected))
    if result.tokens != whole or result.complete != whole or result.finish_reason != "length":
        return Outcome.INCOMPLETE
    return Outcome.OK


def request(request_id: str, tokens: int) -> Any:
    """A streaming ``GenerateRequest`` for ``tokens`` tokens."""
    return pb.GenerateRequest(request_id=request_id, sampling_params=pb.SamplingParams(max_tokens=tokens), stream=True)


async def generate(
    stub: Any,
    request_id: str,
    *,
    tokens: int,
    timeout: float = DEFAULT_CALL_TIMEOUT_SECS,
    leave_after_tokens: int | None = None,
) -> CallResult:
    """Call ``Generate`` for ``tokens`` tokens on ``stub`` (a ``VllmEngineStub``) and read it to its
    end. ``leave_after_tokens``: cancel the call once that many tokens arrived (the result says
    ``left``)."""
    seen: list[int] = []
    complete: tuple[int, ...] | None = None
    finish: str | None = None
    call = stub.Generate(request(request_id, tokens), timeout=timeout)
    try:
        async for message in call:
            if message.HasField("chunk"):
                seen.extend(message.chunk.token_ids)
                if leave_after_tokens is not None and len(seen) >= leave_after_tokens:
                    call.cancel()
                    return CallResult(code="CANCELLED", expected=tokens, tokens=tuple(seen), left=True)
            elif message.HasField("complete"):
                complete = tuple(message.complete.output_ids)
                finish = message.complete.finish_reason
    except grpc.aio.AioRpcError as exc:
        return CallResult(
            code=exc.code().name,
            expected=tokens,
            tokens=tuple(seen),
            complete=complete,
            finish_reason=finish,
            details=exc.details(),
        )
    return CallResult(code="OK", expected=tokens, tokens=tuple(seen), complete=complete, finish_reason=finish)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    request_id: str
    started: float
    """``time.monotonic()`` when the call was made."""
    finished: float
    """``time.monotonic()`` when it ended."""
    outcome: Outcome
    code: str
    details: str | None
    tokens_seen: int

    @property
    def duration(self) -> float:
        return self.finished - self.started


@dataclasses.dataclass(slots=True)
class GrpcLoad:
    """``clients`` workers calling ``Generate`` on ``target`` (``host:port``) back to back, over one channel."""

    target: str
    clients: int = 8
    tokens: int = 10
    """Tokens per call; the model server paces them (its ``--interval-ms``)."""
    leave_fraction: float = 0.0
    """Share of calls whose client cancels after a random number of tokens (may change while running)."""
    seed: int | None = None
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECS
    name: str = "grpc"
    """The prefix of the calls' request ids (``NAME-CLIENT-N``)."""
    stagger_secs: float = 0.0
    """Spread the clients' first calls evenly over this long (one call's length, typically), so calls
    arrive at a steady rate, as from independent users, rather than in waves that all end at once."""
    records: list[Record] = dataclasses.field(default_factory=list)
    _workers: workers.Workers[Any] = dataclasses.field(default_factory=workers.Workers)
    _rng: random.Random = dataclasses.field(default_factory=random.Random)

    @property
    def lost(self) -> list[Record]:
        return [r for r in self.records if r.outcome.lost]

    async def start(self) -> None:
        self._rng = random.Random(self.seed)
        channel = grpc.aio.insecure_channel(self.target)
        self._workers.start_shared(self.clients, pb_grpc.VllmEngineStub(channel), self._worker, channel.close)

    async def stop(self) -> list[Record]:
        """Let every worker finish its current call, then close the channel. Returns all records."""
        await self._workers.stop()
        return self.records

    async def _worker(self, stub: Any, index: int) -> None:
        if self.stagger_secs:  # load shaping, not synchronisation: the i-th user arrives a little later
            await asyncio.sleep(index * self.stagger_secs / self.clients)
        for n in itertools.count():
            if self._workers.stopping.is_set():
                return
            leave = None
            if self.leave_fraction and self._rng.random() < self.leave_fraction:
                leave = self._rng.randint(1, max(1, self.tokens - 1))
            request_id = f"{self.name}-{index}-{n}"
            started = time.monotonic()
            result = await generate(
                stub, request_id, tokens=self.tokens, timeout=self.call_timeout, leave_after_tokens=leave
            )
            outcome = classify(result)
            self.records.append(
                Record(
                    request_id=request_id,
                    started=started,
                    finished=time.monotonic(),
                    outcome=outcome,
                    code=result.code,
                    details=result.details,
                    tokens_seen=len(result.tokens),
                )
            )
            if outcome is Outcome.FAILED:
                await asyncio.sleep(FAILED_PAUSE_SECS)  # do not spin on a dead address
