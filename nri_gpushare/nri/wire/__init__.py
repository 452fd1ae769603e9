"""NRI wire layer: sans-IO mux and ttrpc codecs plus a thin asyncio transport."""

from nri_gpushare.nri.wire.errors import (
    Code,
    ConnectionClosed,
    DecodeError,
    MessageTooLarge,
    ProtocolError,
    TtrpcError,
    WireError,
)
from nri_gpushare.nri.wire.mux import PLUGIN_CONN, RUNTIME_CONN, MuxDecoder, encode_frames
from nri_gpushare.nri.wire.transport import Handler, MuxConnection, TtrpcClient
from nri_gpushare.nri.wire.ttrpc import Request, Response, TtrpcConnection

__all__ = [
    "PLUGIN_CONN",
    "RUNTIME_CONN",
    "Code",
    "ConnectionClosed",
    "DecodeError",
    "Handler",
    "MessageTooLarge",
    "MuxConnection",
    "MuxDecoder",
    "ProtocolError",
    "Request",
    "Response",
    "TtrpcClient",
    "TtrpcConnection",
    "TtrpcError",
    "WireError",
    "encode_frames",
]
