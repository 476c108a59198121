"""Synchronous client for corrald over ZeroMQ (a DEALER socket; one frame per message)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from types import TracebackType

import zmq

from ._proto import pb
from .endpoint import default_endpoint
from .errors import DeadlineExceeded, ProtocolError, error_for_code


@dataclass(frozen=True)
class Pong:
    """The daemon's answer to :meth:`Client.ping`."""

    version: str
    protocol_version: int
    uptime_ms: int


class Client:
    """A connection to corrald.

    ``endpoint`` defaults to ``$CORRAL_ENDPOINT`` or the daemon's default endpoint; ``app`` names
    the calling app (the config's ``apps`` section); ``timeout`` (seconds) bounds every call.
    Not thread-safe: use one client per thread. Use it as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, endpoint: str | None = None, app: str = "", timeout: float = 30.0) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.app = app
        self.timeout = timeout
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.endpoint)
        self._ids = itertools.count(1)

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        if not self._sock.closed:
            self._sock.close(0)
            self._ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, **body: object) -> int:
        request_id = next(self._ids)
        req = pb.Request(
            id=request_id, app=self.app, protocol_version=pb.PROTOCOL_VERSION_CURRENT, **body
        )
        self._sock.send(req.SerializeToString())
        return request_id

    def _receive(self, request_id: int, timeout: float | None) -> "pb.Response":
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(left_ms, zmq.POLLIN):
                raise DeadlineExceeded(
                    f"no answer from corrald at {self.endpoint} within {limit:g} s "
                    "(is it running?)"
                )
            resp = pb.Response()
            try:
                resp.ParseFromString(self._sock.recv())
            except Exception as exc:  # protobuf raises DecodeError; keep the cause
                raise ProtocolError(f"undecodable response from {self.endpoint}") from exc
            if resp.id in (request_id, 0):
                if resp.WhichOneof("body") == "error":
                    raise error_for_code(
                        pb.ErrorCode.Name(resp.error.code), resp.error.message
                    )
                return resp
            # An answer to a request this client abandoned: skip it.

    def ping(self, timeout: float | None = None) -> Pong:
        """Check that the daemon is alive; returns its version and uptime."""
        request_id = self._send(ping=pb.Ping())
        resp = self._receive(request_id, timeout)
        if resp.WhichOneof("body") != "pong":
            raise ProtocolError(f"unexpected answer to ping: {resp.WhichOneof('body')}")
        return Pong(resp.pong.version, resp.pong.protocol_version, resp.pong.uptime_ms)
