"""What the router sends upstream and back, besides the bytes: the request's target and headers.

Only origin-form targets are proxied, and the URL is checked (:func:`upstream_url`); hop-by-hop
headers are dropped both ways; this hop is appended to ``X-Forwarded-For`` and ``Forwarded``.
"""

from __future__ import annotations

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from router import headers as headers_mod

#: Dropped both ways: the hop-by-hop headers, and ``Expect`` (the router already answered any
#: 100-continue). Also dropped: any header named in ``Connection``.
HOP_BY_HOP = headers_mod.HOP_BY_HOP | {"expect"}
_X_FORWARDED_FOR = istr("X-Forwarded-For")
_X_FORWARDED_PROTO = istr("X-Forwarded-Proto")
_X_FORWARDED_HOST = istr("X-Forwarded-Host")
_REPLACED_UPSTREAM = frozenset({"x-forwarded-for", "forwarded", "x-real-ip"})
#: Never removed by being named in ``Connection``: SPEC keeps ``Host``, and a client must not be able
#: to make the model server see the router's upstream address as the host.
_NEVER_NAMED = frozenset({"host"})


def end_to_end(incoming: CIMultiDictProxy[str], also_drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """``incoming`` without its hop-by-hop headers (and those named in its ``Connection``, except
    ``Host``), nor the lowercase names in ``also_drop``. Every comparison ignores case."""
    named = headers_mod.named_in_connection(incoming.getall(hdrs.CONNECTION, ())) - _NEVER_NAMED
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in also_drop:
            continue
        out.add(name, value)
    return out


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _forwarded_node(value: str) -> str:
    """A value for RFC 7239 ``Forwarded``: an IPv6 address bracketed, anything not a token quoted."""
    if value.count(":") > 1 and not value.startswith("["):
        value = f"[{value}]"
    if value and all(c in _TOKEN_CHARS for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def request_headers(request: web.BaseRequest) -> CIMultiDict[str]:
    """Headers to send upstream: hop-by-hop dropped, ``Host`` kept, this hop appended to
    ``X-Forwarded-For`` and ``Forwarded``, ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` set.

    Trust model: the router vouches only for what it saw itself (its peer, the scheme, the Host), which
    it appends last; earlier entries of the list-valued headers are passed on as claims. A
    single-valued client-identity claim (``X-Real-IP``) is dropped: the router cannot tell who set it.
    """
    incoming = request.headers
    out = end_to_end(incoming, _REPLACED_UPSTREAM)
    peer = request.remote or ""
    prior = incoming.getall(_X_FORWARDED_FOR, ())
    out[_X_FORWARDED_FOR] = ", ".join([*prior, peer]) if prior else peer
    out[_X_FORWARDED_PROTO] = request.scheme
    host = incoming.get(hdrs.HOST)
    if host is not None:
        out[_X_FORWARDED_HOST] = host
    hop = f"for={_forwarded_node(peer)};proto={request.scheme}"
    if host is not None:
        hop += f";host={_forwarded_node(host)}"
    out[hdrs.FORWARDED] = ", ".join([*incoming.getall(hdrs.FORWARDED, ()), hop])
    return out


def response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    """Headers to send the client: hop-by-hop (and those named in ``Connection``) dropped."""
    return end_to_end(upstream.headers)


def upstream_url(base: URL, target: str) -> URL:
    """The upstream URL for a request target: ``base`` plus an origin-form target (``/path?query``).

    Raises :class:`BadTarget` for anything else, and checks the result: no request target can change
    the scheme, host or port the router connects to (``/@evil:6443`` stays a path).
    """
    if not target.startswith("/"):
        raise BadTarget(target)
    url = URL(str(base) + target, encoded=True)
    if url.scheme != base.scheme or url.raw_host != base.raw_host or url.port != base.port:
        raise BadTarget(target)
    return url


class BadTarget(ValueError):
    """A request target that is not origin-form (CONNECT authority, absolute-form, ``*``)."""
