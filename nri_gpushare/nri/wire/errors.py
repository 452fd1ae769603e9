"""Errors and status codes shared by the wire layer."""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    """gRPC status codes, as carried in ttrpc responses."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def as_code(value: int) -> Code | int:
    """`Code(value)` when the value is a known code, else the plain int."""
    try:
        return Code(value)
    except ValueError:
        return value


def describe_error(exc: BaseException) -> str:
    """An exception's message, or its type's name (also when str() itself fails)."""
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__


class WireError(Exception):
    """Base class of every error raised by the wire layer."""


class ProtocolError(WireError):
    """The peer broke the mux or ttrpc protocol; the connection cannot go on."""


class DecodeError(ProtocolError, ValueError):
    """Bytes that are not a well-formed protobuf message of the expected type.

    Raised by the protobuf walker (`wire.pb`) for ttrpc envelopes, where it ends
    the connection like any ProtocolError, and for NRI payloads
    (`nri_gpushare.nri.api.lite`), where the stub answers INVALID_ARGUMENT.
    """


class MessageTooLarge(WireError, ValueError):
    """A message we were asked to send exceeds what the peer will accept."""


class ConnectionClosed(WireError, ConnectionError):
    """The connection ended before the operation completed (also a ConnectionError)."""


class TtrpcError(WireError):
    """A non-OK ttrpc status: raised by clients, raised by handlers to answer it."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = as_code(code)
        self.message = message
        super().__init__(code, message)

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, Code) else "code"
        return f"{name} ({int(self.code)}): {self.message}"
