"""The traffic path's conformance suite: the invariants (framing decided once; one request in,
one response out; bounds both ways; pipelining), attacked with generated input in both directions and
judged by an independent strict HTTP/1.1 parser (h11), never by the router's own code.

- :mod:`.wire`: the raw-socket upstream (h11 as the server, per request), the h11 client oracle,
  and the waits on the router's admin endpoints.
- ``test_requests``: client → router → upstream, hypothesis-generated request streams.
- ``test_responses``: upstream → router → client, hypothesis-generated response bytes.
- ``test_memory``: pipelining floods against a silent upstream: bounded RSS and in-flight.
- ``test_regressions``: one named test per defect of the attack report.
"""
