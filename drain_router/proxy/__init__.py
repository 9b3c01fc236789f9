"""The router's I/O: the traffic path (listener, client connections, exchanges, the upstream pool, on
asyncio Protocols with httptools), the admin listener (aiohttp), and the lifecycle. Decisions live in
``drain_router.decisions``; this package gathers observations, asks, and carries out the answer."""
