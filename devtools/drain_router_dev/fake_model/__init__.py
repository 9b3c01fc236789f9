"""``drain-router-dev fake-model``: a stand-in OpenAI-compatible streaming model server, and a testing kit.

A demo and test tool, not a model: it "generates" ``chunks`` tokens, one every ``interval_ms``,
after an optional ``first_token_ms`` of silent "prefill": the sequence `` t0 t1 t2 ...`` resumed
after the ``t<k>`` that ends the prompt, so a continuation of a cut answer is its rest byte for byte
(:mod:`.openai`). Every streamed chunk carries a sequence number (``seq``, from 0, and ``total``),
so a client can tell a complete stream from one that lost chunks; a complete stream ends with
``data: [DONE]``. With a batch size (``--batch-size B``) the
completions share the engine's capacity as continuous batching does: past ``B`` at once, each one's
tokens come slower (:mod:`.capacity`).

- :mod:`.openai`: the answer shapes and per-request overrides (pure);
- :mod:`.capacity`: the capacity model, a stream's time per token under load (pure), and
  :mod:`.batch`, the streams generating now and the pause before each one's next token;
- :mod:`.realtime`: the realtime session's events (pure);
- :mod:`.app`: the one aiohttp application (:func:`make_app`): its handlers;
- :mod:`.state`: what a server has seen and a test may steer (:class:`State`);
- :mod:`.session`: one realtime session's conversation;
- :mod:`.serve`: the CLI process, with vLLM's ``--shutdown-timeout`` semantics on SIGTERM;
- :mod:`.testing`: the same application in a test's event loop (:func:`testing.running`);
- :mod:`.grpc_server`: the optional gRPC endpoint (``--grpc-port``; grpcio is loaded only then), with
  :mod:`.grpc_engine` (vLLM's engine service), :mod:`.grpc_inference` (a Triton-shaped raw-bytes
  service) and :mod:`.calls` (what it counts, in :attr:`State.grpc`).

Endpoints: ``POST /v1/completions`` and ``/v1/chat/completions`` (``"stream": true`` answers
server-sent events; the query parameters or JSON fields ``chunks`` (or ``max_completion_tokens``,
``max_tokens``), ``interval_ms`` and ``first_token_ms`` override the defaults; vLLM's
``continue_final_message``, ``return_token_ids`` and ``stream_options.include_usage`` are honoured), ``GET /health`` (200 while serving),
``GET /stats`` (``started``, ``finished``, ``cancelled``, ``active``, ``max_active`` (the peak of
``active``), and the realtime ``sessions``
open now, ``sessions_opened``, ``sessions_closed``; the gRPC calls' counters under ``grpc``),
``GET /v1/models``; ``GET /v1/realtime``, a WebSocket session with OpenAI-Realtime-shaped events
(:mod:`.realtime`); and, for proxy tests, ``/sse``, ``/echo``, ``/cut``, ``/short``,
``/lowercase-hops``, ``/status/{code}``. With ``--grpc-port``, gRPC on its own port
(:mod:`.grpc_server`).
"""

from drain_router_dev.fake_model.app import make_app
from drain_router_dev.fake_model.openai import Settings
from drain_router_dev.fake_model.serve import command
from drain_router_dev.fake_model.state import State

__all__ = ["Settings", "State", "command", "make_app"]
