"""A lingering close: what was written goes out followed by a FIN, what the peer still sends is read
and dropped, and the socket is closed at the peer's own FIN or after a bounded time.

Closing a TCP socket while its peer is still sending (bytes unread in the kernel, or arriving after
the close) makes the kernel answer with a reset instead of a FIN. A reset throws away what this end's
kernel had not sent yet and makes the peer give up on what it had not read yet: the answer written
just before the close is lost. So a connection whose peer may still be sending is closed this way by
every listener (HTTP/1.1 after an answer with input unread, a refused connection, an HTTP/2
connection at its end); its protocol drops what it reads meanwhile, and asyncio closes the transport
at the peer's FIN.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: How long the process's exit waits for the lingering closes of its client connections (a client
#: that reads sends its FIN within a round trip); what is left then is cut. Less than the deadline's
#: margin before the pod's grace ends (``SHUTDOWN_DEADLINE_MARGIN_SECS``), so the process still
#: exits before the kubelet's SIGKILL.
EXIT_LINGER_SECS = 1.0


def linger(transport: Any, secs: float, *, cut: bool = False) -> bool:
    """Start the lingering close of ``transport``: a FIN once what is written has gone out, then
    closed after ``secs`` (aborted with ``cut``: a peer that does not read would otherwise hold the
    closing transport forever). False when the transport cannot half-close: closed at once."""
    if not transport.can_write_eof():
        transport.close()
        return False
    transport.write_eof()
    asyncio.get_running_loop().call_later(secs, transport.abort if cut else transport.close)
    return True
