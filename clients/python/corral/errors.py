"""Exceptions raised by the corral client: one class per error code of the protocol.

Every code in ``ErrorCode`` of ``proto/corral.proto`` (the same table as the C status enum) has a
class here; ``error_for_code`` picks the right one. All derive from :class:`CorralError`.
"""

from __future__ import annotations


class CorralError(Exception):
    """A request to corrald failed. ``code`` is the wire name, e.g. ``"NOT_FOUND"``."""

    code: str = "INTERNAL"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(CorralError):
    code = "INVALID_ARGUMENT"


class NotFound(CorralError):
    code = "NOT_FOUND"


class IOFailure(CorralError):
    code = "IO"


class FormatError(CorralError):
    code = "FORMAT"


class Unsupported(CorralError):
    code = "UNSUPPORTED"


class OutOfMemory(CorralError):
    code = "OUT_OF_MEMORY"


class ResourceExhausted(CorralError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(CorralError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(CorralError):
    code = "CANCELLED"


class PermissionDenied(CorralError):
    code = "PERMISSION_DENIED"


class SanitizerRejected(CorralError):
    code = "SANITIZER_REJECTED"


class InternalError(CorralError):
    code = "INTERNAL"


class Unavailable(CorralError, ConnectionError):
    code = "UNAVAILABLE"


class ProtocolError(CorralError):
    code = "PROTOCOL"


class FailedPrecondition(CorralError):
    code = "FAILED_PRECONDITION"


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
