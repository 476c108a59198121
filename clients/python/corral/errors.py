"""Exceptions raised by the corral client: one class per error code of the protocol.

Every code in ``ErrorCode`` of ``proto/corral.proto`` (the same table as the C status enum) has a
class here; ``error_for_code`` picks the right one. All derive from :class:`CorralError`.
"""

from __future__ import annotations


class CorralError(Exception):
    """A request to corrald failed. ``code`` is the wire name, e.g. ``"NOT_FOUND"``."""

    code: str = "INTERNAL"

    #: The daemon's (or the client's) explanation, naming what was wrong.
    message: str

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(CorralError, ValueError):
    """A request parameter was out of range or malformed (also raised by the client itself
    for values that cannot be encoded, so it is a :class:`ValueError` too)."""

    code = "INVALID_ARGUMENT"


class NotFound(CorralError):
    """The named model, session or request does not exist."""

    code = "NOT_FOUND"


class IOFailure(CorralError):
    """The daemon could not read or write a file (a model, the swap directory)."""

    code = "IO"


class FormatError(CorralError):
    """A model file is malformed."""

    code = "FORMAT"


class Unsupported(CorralError):
    """The daemon does not support what was asked (a request body, a model feature)."""

    code = "UNSUPPORTED"


class OutOfMemory(CorralError):
    """The daemon ran out of memory for the request."""

    code = "OUT_OF_MEMORY"


class ResourceExhausted(CorralError):
    """A queue or budget is full; retry later."""

    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(CorralError, TimeoutError):
    """The request's ``deadline_ms`` passed, or the daemon said nothing within the client's
    ``timeout`` (then the message names the endpoint)."""

    code = "DEADLINE_EXCEEDED"


class Cancelled(CorralError):
    """The request was cancelled before it started."""

    code = "CANCELLED"


class PermissionDenied(CorralError):
    """The app may not use this model, priority or session."""

    code = "PERMISSION_DENIED"


class SanitizerRejected(CorralError):
    """The input sanitizer refused the prompt."""

    code = "SANITIZER_REJECTED"


class InternalError(CorralError):
    """A bug in the daemon."""

    code = "INTERNAL"


class Unavailable(CorralError, ConnectionError):
    """The daemon cannot be reached, restarted while a request was in flight, or this
    client is closed."""

    code = "UNAVAILABLE"


class ProtocolError(CorralError):
    """A message could not be decoded, or an answer did not fit the request."""

    code = "PROTOCOL"


class FailedPrecondition(CorralError):
    """The daemon is not in a state that allows the request (e.g. model unloading)."""

    code = "FAILED_PRECONDITION"


#: Every exception class by its wire code name (``"NOT_FOUND"`` → :class:`NotFound`).
ERRORS_BY_CODE: dict[str, type[CorralError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        IOFailure,
        FormatError,
        Unsupported,
        OutOfMemory,
        ResourceExhausted,
        DeadlineExceeded,
        Cancelled,
        PermissionDenied,
        SanitizerRejected,
        InternalError,
        Unavailable,
        ProtocolError,
        FailedPrecondition,
    )
}


def error_for_code(code: str, message: str) -> CorralError:
    """The exception for a wire error code name; unknown names give a plain CorralError."""
    cls = ERRORS_BY_CODE.get(code)
    return cls(message) if cls else CorralError(message, code)
