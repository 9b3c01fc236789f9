"""The router's I/O: aiohttp app, forwarding, health endpoints, lifecycle. Decisions live in
``router.decisions``; this package gathers observations, asks, and carries out the answer."""
