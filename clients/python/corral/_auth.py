"""Who the client is to corrald (SECURITY.md): CURVE keys for tcp endpoints, and what a refused
handshake means.

corrald establishes the app of every request itself: over ipc from the client's user, over tcp
only from a CURVE key. Keys are z85 text (40 characters) in files of one key line, with ``#``
comments, as ``corral keygen`` writes them; the rules are the C library's (base/src/curve.c): a
secret key file other users may read is refused. Keys come from the arguments, else from the
environment: ``CORRAL_SERVER_KEY`` or ``CORRAL_SERVER_KEY_FILE`` (corrald's public key) and
``CORRAL_CLIENT_KEY_FILE`` (this client's secret key).

A refused handshake shows on the socket's monitor, not as a message: :func:`refusal` turns the
event into the message of the PermissionDenied every waiting call then raises, at once.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import Optional, Sequence, Tuple

import zmq

from ._proto import pb
from .errors import InvalidArgument, IOFailure, NotFound, PermissionDenied, Unsupported

#: Monitor events that tell a refused or failed handshake.
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_MECHANISM_MISMATCH = 0x11000002
_KEY_FILE_MAX = 4096


def key_valid(text: str) -> bool:
    """Whether text is a CURVE key in z85: 40 characters, each group of 5 below 2**32."""
    if len(text) != 40 or any(c not in _Z85 for c in text):
        return False
    for group in range(8):
        value = 0
        for c in text[group * 5 : group * 5 + 5]:
            value = value * 85 + _Z85.index(c)
        if value >= 1 << 32:
            return False
    return True


def read_key_file(path: str, secret: bool) -> str:
    """The key of a key file; raises NotFound, IOFailure, PermissionDenied (a secret key file
    other users may read or write) or InvalidArgument (not one key)."""
    what = "secret key file" if secret else "public key file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFound(f"{what} {path}: {exc.strerror}") from None
    except OSError as exc:
        raise IOFailure(f"{what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"{what} {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if secret and mode & stat.S_IRWXO:
            raise PermissionDenied(
                f"{what} {path} has mode {mode:03o}: other users may read it, and anyone who "
                f"reads it can pose as its owner (chmod 600 {path})"
            )
        if st.st_size > _KEY_FILE_MAX:
            raise InvalidArgument(f"{what} {path} is larger than {_KEY_FILE_MAX} bytes")
        data = os.read(fd, _KEY_FILE_MAX).decode("ascii", "replace")
    finally:
        os.close(fd)
    keys = [
        line.strip() for line in data.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    if len(keys) != 1 or not key_valid(keys[0]):
        raise InvalidArgument(
            f"{what} {path} does not hold one CURVE key (a line of 40 z85 characters, as "
            "`corral keygen` writes)"
        )
    return keys[0]


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value or None


def curve_keys(
    endpoint: str,
    server_key: Optional[str],
    server_key_file: Optional[str],
    client_key_file: Optional[str],
) -> Optional[Tuple[bytes, bytes, bytes]]:
    """(server public, client public, client secret) for a tcp endpoint, as z85 bytes; None for
    ipc endpoints and when no key is given anywhere (corrald then refuses a tcp connection, and
    the refusal says how to fix it). Raises when only one of the two keys is given, or a key
    does not read."""
    if not endpoint.startswith("tcp://"):
        return None
    if server_key is None and server_key_file is None:
        server_key = _env("CORRAL_SERVER_KEY")
        if server_key is None:
            server_key_file = _env("CORRAL_SERVER_KEY_FILE")
    if client_key_file is None:
        client_key_file = _env("CORRAL_CLIENT_KEY_FILE")
    if server_key is None and server_key_file is None and client_key_file is None:
        return None
    if client_key_file is None:
        raise InvalidArgument(
            "CURVE needs this client's secret key as well as corrald's public key: pass "
            "client_key_file or set CORRAL_CLIENT_KEY_FILE to the NAME.key file `corral keygen` "
            "wrote"
        )
    if server_key is None and server_key_file is None:
        raise InvalidArgument(
            "CURVE needs corrald's public key as well as this client's secret key: pass "
            "server_key or set CORRAL_SERVER_KEY (or CORRAL_SERVER_KEY_FILE) to the key of "
            "corrald's NAME.pub"
        )
    if server_key is not None:
        if not key_valid(server_key):
            raise InvalidArgument(
                "the server key is not a CURVE public key (40 characters of z85, as in the "
                "NAME.pub file `corral keygen` writes)"
            )
        server = server_key
    else:
        assert server_key_file is not None
        server = read_key_file(server_key_file, secret=False)
    secret = read_key_file(client_key_file, secret=True).encode()
    if not zmq.has("curve"):
        raise Unsupported("this libzmq has no CURVE support (it must be built with libsodium)")
    return server.encode(), zmq.curve_public(secret), secret


def set_curve(sock: zmq.Socket, keys: Tuple[bytes, bytes, bytes]) -> None:
    """Make sock a CURVE client with keys (before it connects)."""
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys


def event_value(frames: Sequence[bytes]) -> int:
    """The value of a socket-monitor event (native-endian uint32 after the event number)."""
    if not frames or len(frames[0]) < 6:
        return 0
    return int(struct.unpack_from("=I", frames[0], 2)[0])


def final(event: int) -> bool:
    """Whether a failed handshake is for good: libzmq does not retry one that was refused or
    broke the protocol (a connection lost in the handshake is retried)."""
    return event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


def refusal(endpoint: str, event: int, value: int, curve: bool) -> Optional[Tuple[int, str]]:
    """What a failed handshake means: the error code (PERMISSION_DENIED, or PROTOCOL for a
    handshake that broke down without CURVE) and message every waiting call raises; None for
    other events, and for a connection lost in the handshake that libzmq retries."""
    denied = pb.PERMISSION_DENIED
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if curve:
            return denied, (
                f"corrald at {endpoint} refused this client's CURVE key: no app lists its public "
                "key in curve_keys"
            )
        return denied, (
            f"corrald at {endpoint} refused this connection: no app lists this user (uid "
            f"{os.getuid()}, gid {os.getgid()}) in its uids or gids, and it is not corrald's owner"
        )
    if event not in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        return None
    # corrald serves tcp with CURVE only: a client without keys is refused there, whichever side
    # notices the mismatch of mechanisms first (the other sees the connection drop).
    if endpoint.startswith("tcp://") and not curve:
        return denied, (
            f"corrald at {endpoint} refused the connection: tcp needs CURVE keys (pass "
            "server_key and client_key_file, or set CORRAL_SERVER_KEY and "
            "CORRAL_CLIENT_KEY_FILE; see SECURITY.md)"
        )
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return None
    if value == _MECHANISM_MISMATCH:
        return denied, f"corrald at {endpoint} refused the connection: it does not use CURVE there"
    if curve:
        return denied, (
            f"the handshake with corrald at {endpoint} failed (is the server key corrald's public "
            "key?)"
        )
    return pb.PROTOCOL, f"the handshake with corrald at {endpoint} failed"
