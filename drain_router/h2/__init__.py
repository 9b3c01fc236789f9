"""HTTP/2, sans-IO (RFC 9113): one end of a connection (bytes in, events and frames out), the stream
table (§5.1), header blocks and HPACK, frames, flow-control windows and what a stream may carry."""
