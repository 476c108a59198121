"""corral — Python client for corrald, the local model supervisor.

    from corral import Client
    with Client() as c:
        print(c.generate("stories", "Once upon a time", max_tokens=64))

:class:`Client` is synchronous, :class:`AsyncClient` its asyncio twin. Results are plain
dataclasses (:mod:`corral.types`); failures raise one exception class per protocol error code
(:mod:`corral.errors`), all derived from :class:`CorralError`.
"""

from typing import TYPE_CHECKING, Any

from .client import Client, Stream
from .endpoint import default_endpoint
from .errors import (
    Cancelled,
    CorralError,
    DeadlineExceeded,
    FailedPrecondition,
    FormatError,
    InternalError,
    InvalidArgument,
    IOFailure,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    SanitizerRejected,
    Unavailable,
    Unsupported,
    error_for_code,
)
from .types import (
    AdapterInfo,
    ChatMessage,
    Chunk,
    DaemonStatus,
    Done,
    ModelInfo,
    ModelState,
    ModelStatus,
    Pong,
    Priority,
    Progress,
    ProgressPhase,
    Result,
    StatusReply,
    StopReason,
    Timings,
    Tokens,
)

__all__ = [
    "AdapterInfo",
    "AsyncClient",
    "AsyncStream",
    "Cancelled",
    "ChatMessage",
    "Chunk",
    "Client",
    "CorralError",
    "DaemonStatus",
    "DeadlineExceeded",
    "Done",
    "FailedPrecondition",
    "FormatError",
    "IOFailure",
    "InternalError",
    "InvalidArgument",
    "ModelInfo",
    "ModelState",
    "ModelStatus",
    "NotFound",
    "OutOfMemory",
    "PermissionDenied",
    "Pong",
    "Priority",
    "Progress",
    "ProgressPhase",
    "ProtocolError",
    "ResourceExhausted",
    "Result",
    "SanitizerRejected",
    "StatusReply",
    "StopReason",
    "Stream",
    "Timings",
    "Tokens",
    "Unavailable",
    "Unsupported",
    "default_endpoint",
    "error_for_code",
]

if TYPE_CHECKING:
    from .aio import AsyncClient, AsyncStream


def __getattr__(name: str) -> Any:
    """``AsyncClient`` and ``AsyncStream`` are imported on first use: importing asyncio costs
    more than the rest of the package, and synchronous programs do not need it."""
    if name in ("AsyncClient", "AsyncStream"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'corral' has no attribute {name!r}")


#: The version of this package; equal to the daemon's version it was released with.
__version__ = "0.1.0"
