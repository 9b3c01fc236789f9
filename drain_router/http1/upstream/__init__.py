"""The model server's side of HTTP/1.1: the pool and one keep-alive upstream connection."""
