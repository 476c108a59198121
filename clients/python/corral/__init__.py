"""corral — Python client for corrald, the local model supervisor.

    from corral import Client
    with Client() as c:
        print(c.ping().version)
"""

from .client import Client, Pong
from .endpoint import default_endpoint
from .errors import (
    CorralError,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ProtocolError,
    ResourceExhausted,
    Unavailable,
    error_for_code,
)

__all__ = [
    "Client",
    "Pong",
    "default_endpoint",
    "CorralError",
    "DeadlineExceeded",
    "InvalidArgument",
    "NotFound",
    "ProtocolError",
    "ResourceExhausted",
    "Unavailable",
    "error_for_code",
]

__version__ = "0.1.0"
