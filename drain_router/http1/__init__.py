"""The HTTP/1.1 traffic path: the listener, a client connection, the request reader and its
pipeline, the exchange (one proxied request, counted exactly), the router's own answers, honest
stream ends, the upstream pool (:mod:`.upstream`) and WebSocket tunnels (:mod:`.websocket`)."""
