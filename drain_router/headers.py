"""HTTP header rules shared by the router's proxy and the demo's balancer. Pure."""

from __future__ import annotations

from collections.abc import Iterable

#: The header that marks an answer of the router's own to a request the model server never saw
#: (refused at closing, queue full or timed out, no upstream connection made): a tier above, or a
#: client, may send that request to another replica without risk of running it twice. Its value is
#: the answer's reason (the JSON body's ``error.type``; for gRPC the admission reason).
REFUSED = "x-drain-router-refused"

#: Hop-by-hop headers: RFC 9110 section 7.6.1 plus the legacy ones still seen in the wild. Lowercase:
#: names compare case-insensitively (gateways speaking HTTP/2 upstream send them all lowercase).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def named_in_connection(values: Iterable[str]) -> set[str]:
    """The lowercase header names listed in ``Connection`` header values (hop-by-hop as well)."""
    return {token.strip().lower() for value in values for token in value.split(",") if token.strip()}
