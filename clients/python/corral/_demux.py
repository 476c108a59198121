"""Request ids and the routing of Responses to the request they answer (no I/O here).

One connection carries several requests at once: two streams read in turns, a status call in the
middle of a stream. Each request the caller waits on has an inbox; every frame read from the
socket is decoded once and appended to the inbox of its id. Frames for requests nobody waits on
any more (abandoned streams, Acks of fire-and-forget Cancels, keepalive Pongs) are dropped.

Two things are not addressed to one request and go to every inbox: an Error with id 0 (the daemon
could not decode something this connection sent) and a frame this client cannot decode.

Liveness: a daemon that is not there (an attempt to connect failed: no socket file, nothing
listening) and never accepted the connection is reported within ``_codec.CONNECT_TIMEOUT_S``
(:meth:`Demux.not_running`). ``last_heard`` is when the daemon
last said anything; the patient callers' timeouts
measure silence from it. When the connection drops (the daemon stopped, crashed or restarted, or
refused an oversized message), requests in flight can never be answered: :meth:`connection_lost`
gives each an UNAVAILABLE error instead of leaving it to wait on a daemon that knows nothing of it;
when corrald refuses the connection itself (:meth:`refused`), each gets that refusal at once.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Deque, Dict, Optional, Set

from . import _codec
from ._proto import pb


class Demux:
    """Ids, inboxes and liveness bookkeeping of one connection. Not thread-safe."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self.inboxes: Dict[int, Deque[Any]] = {}
        self._keepalive: Set[int] = set()
        self.last_heard = float("-inf")  # monotonic time of the last frame received
        self.last_sent = float("-inf")  # monotonic time of the last request sent
        # Whether anything ever accepted the connection (the monitor's EVENT_CONNECTED: the
        # kernel accepts it whatever the daemon's threads are doing), whether an attempt failed
        # (EVENT_CONNECT_RETRIED: refused, or no socket file), and when a call first waited: a
        # call fails with Unavailable once CONNECT_TIMEOUT_S passed from there with an attempt
        # failed and no connection (no daemon is running). Without a failed attempt (libzmq's
        # I/O thread not yet scheduled on a busy machine, a tcp connection still pending) calls
        # wait as usual: a daemon that is there is not reported missing because the machine is
        # slow.
        self.connected = False
        self.connect_refused = False
        self.connect_since: Optional[float] = None
        # A refused handshake is followed by its connection's drop (libzmq reports every failed
        # handshake, then the disconnection): that drop is the refusal's, already told, and must
        # not fail the requests sent since (the next call's, on the connection libzmq retries).
        self._refusal_drop_due = False

    def connect_deadline(self, now: float) -> Optional[float]:
        """When a waiting call gives up on a daemon that never accepted the connection (None
        once one did); the first call that asks starts the clock."""
        if self.connected:
            return None
        if self.connect_since is None:
            self.connect_since = now
        return self.connect_since + _codec.CONNECT_TIMEOUT_S

    def not_running(self, now: float) -> bool:
        """Whether a waiting call should give up on the daemon now: never connected, an attempt
        failed, and CONNECT_TIMEOUT_S passed since the first call waited."""
        deadline = self.connect_deadline(now)
        return deadline is not None and self.connect_refused and now >= deadline

    def connect_failed(self) -> Set[int]:
        """An attempt to connect failed (the monitor's EVENT_CONNECT_RETRIED). Returns the ids
        in flight, whose waiters should look again."""
        self.connect_refused = True
        return set(self.inboxes)

    def new_id(self) -> int:
        """A fresh request id whose answers will be dropped (fire-and-forget requests)."""
        return next(self._ids)

    def open(self) -> int:
        """A fresh request id with an inbox that collects its answers until :meth:`forget`."""
        rid = next(self._ids)
        self.inboxes[rid] = deque()
        return rid

    def keepalive_id(self) -> int:
        """A fresh id for a keepalive Ping: its Pong only refreshes ``last_heard``."""
        rid = next(self._ids)
        self._keepalive.add(rid)
        return rid

    def sent(self, now: float) -> None:
        """Note that a request went out (any request counts for the liveness rule)."""
        self.last_sent = now

    def forget(self, rid: int) -> None:
        """Stop collecting answers for ``rid``; later ones are dropped."""
        self.inboxes.pop(rid, None)
        self._keepalive.discard(rid)

    def feed(self, frame: bytes, now: float) -> Set[int]:
        """Route one received frame; returns the ids whose inbox got something."""
        self.last_heard = now
        resp = pb.Response()
        try:
            resp.ParseFromString(frame)
        except Exception:  # protobuf's DecodeError; any failure means the same here
            return self._undecodable(frame)
        if resp.id == 0:
            return self._to_all(resp)
        if resp.id in self._keepalive:
            self._keepalive.discard(resp.id)
            return set()
        box = self.inboxes.get(resp.id)
        if box is None:
            return set()
        box.append(resp)
        return {resp.id}

    def _undecodable(self, frame: bytes) -> Set[int]:
        """A frame that does not decode fails the request whose id it starts with (corrald
        writes the id first), and only when no id can be read every request in flight."""
        rid = _leading_id(frame)
        message = f"undecodable response from corrald at {self.endpoint}"
        if rid in self._keepalive:
            self._keepalive.discard(rid)
            return set()
        box = self.inboxes.get(rid) if rid else None
        if box is None:
            return self._to_all(_codec.error_response(0, pb.PROTOCOL, message))
        box.append(_codec.error_response(rid, pb.PROTOCOL, f"{message} to request {rid}"))
        return {rid}

    def connection_lost(self) -> Set[int]:
        """The connection dropped: every request in flight gets an UNAVAILABLE error. Returns
        their ids (none when the drop is that of a refused handshake, already reported)."""
        if self._refusal_drop_due:
            self._refusal_drop_due = False
            return set()
        self._keepalive.clear()
        return self._to_all(
            _codec.error_response(
                0,
                pb.UNAVAILABLE,
                f"the connection to corrald at {self.endpoint} was lost while the request was "
                "in flight (the daemon stopped or restarted, or refused an oversized message)",
            )
        )

    def refused(self, code: int, message: str) -> Set[int]:
        """corrald refused the connection's handshake: every request in flight gets the error
        (PERMISSION_DENIED saying why). Returns their ids. The drop of the refused connection,
        which follows, is not reported again (:meth:`connection_lost`)."""
        self._refusal_drop_due = True
        self._keepalive.clear()
        return self._to_all(_codec.error_response(0, code, message))

    def _to_all(self, resp: Any) -> Set[int]:
        for box in self.inboxes.values():
            box.append(resp)
        return set(self.inboxes)


def _leading_id(frame: bytes) -> int:
    """The Response id a frame begins with (field 1, a varint), or 0 when it begins otherwise."""
    if not frame or frame[0] != 0x08:
        return 0
    value = shift = 0
    for byte in frame[1:11]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value if value < 2**64 else 0
        shift += 7
    return 0
