"""WebSocket sessions after the handshake: the tunnel that relays frames both ways and the set of
open sessions a listener closes at the drain."""
