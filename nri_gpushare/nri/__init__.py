"""The NRI protocol, knowing nothing of GPUs: `wire` (ttrpc framing, the
multiplexer, the transport), `api` (NRI messages: lazy views, encoders, the
generated bindings) and `stub` (the plugin side of NRI, in the shape of the
NRI Go stub: a plugin implements only the handlers it needs)."""
