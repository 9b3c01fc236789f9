"""An HTTP/2 (RFC 9113) and HPACK (RFC 7541) conformance suite of our own: every case of h2spec
(github.com/summerwind/h2spec), with h2spec's case ids, frames and acceptance rules, written in Python
over the raw-frame client of the tests (tests/h2client.py: hyperframe and hpack, independent of the
code under test).

What is here:

- ``cases.py``: the case list as data, one :class:`~tests.h2conformance.cases.Case` per h2spec case
  (``generic/``, ``http2/``, ``hpack/``: 146 cases, plus ``http2/5.4.1/2``, which h2spec runs only
  with ``--strict``): the frames sent and the verdicts awaited, in order.
- ``peer.py``: h2spec's client connection (its handshake, its reading one event at a time, its
  WINDOW_UPDATEs as a receiver) and its verdicts, acceptance rules as in h2spec's ``spec/verifier.go``:
  a connection error passes on GOAWAY with an expected code or on the connection's close (so a GOAWAY
  with another code followed by the close passes, as in h2spec); a stream error passes on RST_STREAM
  or GOAWAY with an expected code, or the close; a frame that must be ignored is followed by a PING
  whose ACK must come. Every verdict waits for its event until a deadline (``peer.DEADLINE``, 3 s),
  never for a fixed time.
- ``test_h2spec.py``: each case against each target, test ids ``<target>-<h2spec id>``, e.g.
  ``test_h2spec[router-http2/6.9.1/2]``.

The targets (``conftest.py``):

- ``router``: a ``drain-router serve`` process with ``--grpc-port`` in front of the gRPC test upstream
  (tests/grpcupstream.py), started as the ``grpc_router`` fixture starts it, once per run of the module;
- ``router-nghttpd``: the same router process in front of the reference server below instead, asked
  h2spec's requests as they are (non-gRPC h2c streams): every case passes through a real HTTP/2
  upstream's behaviour (its answers carry a ``content-length``; a HEAD's with no content);
- ``listener``: the gRPC listener (``GrpcListener``) built in the test's event loop in front of the
  gRPC test upstream, as the router's lifecycle builds it;
- ``nghttpd``: the reference server, ``nghttpd --no-tls`` (Debian package ``nghttp2-server``) serving
  a temporary directory (an ``index.html`` and a large file); skipped when ``nghttpd`` is not on
  PATH. Its one known failure, ``http2/5.1.1/2``, is a strict xfail (the reason is in the case).

A gRPC relay answers gRPC calls, so for the ``router`` and ``listener`` targets h2spec's ``GET /``
becomes a unary call to the upstream's ``/t.T/Echo`` (and its flow-control cases read the
server-streaming ``/t.T/Stream``); :class:`~tests.h2conformance.cases.Target` says exactly how. The
reference server and the router in front of it get h2spec's requests as they are. A case that fails
against the router while nghttpd passes it is the router's failure. The three router targets are
held stricter than h2spec holds a server: a GOAWAY there must carry the code the RFC names (h2spec
passes a GOAWAY with another code once the connection closes).

Run it (from the repository's root, after ``make venv``)::

    .venv/bin/pytest tests/h2conformance -q                 # every target
    .venv/bin/pytest tests/h2conformance -q -m nghttpd      # the reference server alone
    .venv/bin/pytest tests/h2conformance -q -k router       # the router process (both upstreams)
    .venv/bin/pytest tests/h2conformance -q -k "listener and http2/6.9"
"""
