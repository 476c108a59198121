"""A scripted stand-in for corrald, to test the client's own mechanics deterministically.

A ROUTER socket on a private ipc endpoint, served by a thread. Every decoded Request is recorded
(``requests``) and handed to a handler that returns what to answer: Responses, raw frames, or
``(delay_s, answer)`` pairs to answer later. Pings are answered with a Pong unless the handler
answers them itself. The real daemon's behaviour is tested elsewhere (test_generate.py); this is
for what only a scripted peer can provoke: silence, restarts, interleaving, bad frames.
"""

from __future__ import annotations

import heapq
import itertools
import os
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

import zmq

from corral._proto import pb

Answer = Union[Any, bytes, Tuple[float, Any]]
Handler = Callable[["FakeDaemon", Any], Optional[Iterable[Answer]]]


def response(request_id: int, **body: Any) -> Any:
    """A Response with one body field, e.g. ``response(3, ack=pb.Ack())``."""
    return pb.Response(id=request_id, **body)


def error(request_id: int, code: int, message: str) -> Any:
    """An Error Response."""
    return pb.Response(id=request_id, error=pb.Error(code=code, message=message))


class FakeDaemon:
    """See the module documentation. Use as a context manager."""

    def __init__(self, handler: Optional[Handler] = None, uptime_ms: int = 1000) -> None:
        self.handler = handler
        self.uptime_ms = uptime_ms  # what the default Pong reports; tests may change it
        self.requests: List[Any] = []
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-fake-")
        self.endpoint = f"ipc://{os.path.join(self._tmp.name, 'fake.sock')}"
        self._ctx = zmq.Context()
        self._seq = itertools.count()
        self._open()

    def _open(self) -> None:
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _shut(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)

    def restart(self) -> None:
        """Drop every connection and listen again on the same endpoint, as a restarted daemon
        would; what was pending is forgotten."""
        self._shut()
        self._open()
        self._thread.start()

    def __enter__(self) -> "FakeDaemon":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._shut()
        self._ctx.term()
        self._tmp.cleanup()

    def received(self, body: Optional[str] = None) -> List[Any]:
        """The Requests received so far (with ``body``, only those carrying it)."""
        with self._lock:
            reqs = list(self.requests)
        return [r for r in reqs if body is None or r.WhichOneof("body") == body]

    def wait_for(self, body: str, count: int = 1, timeout: float = 2.0) -> List[Any]:
        """Wait until ``count`` requests with ``body`` arrived; returns them."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self.received(body)
            if len(got) >= count:
                return got
            time.sleep(0.005)
        raise AssertionError(f"fewer than {count} {body} requests arrived: {self.received()}")

    def _run(self) -> None:
        pending: List[Tuple[float, int, bytes, bytes]] = []  # (when, seq, identity, frame)
        while not self._stop.is_set():
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                _, _, identity, frame = heapq.heappop(pending)
                self._sock.send_multipart([identity, frame])
            wait = 10 if not pending else max(0, int((pending[0][0] - now) * 1000))
            if not self._sock.poll(min(wait, 10), zmq.POLLIN):
                continue
            identity, payload = self._sock.recv_multipart()
            req = pb.Request()
            req.ParseFromString(payload)
            with self._lock:
                self.requests.append(req)
            answers = self.handler(self, req) if self.handler else None
            if answers is None:
                answers = []
                if req.WhichOneof("body") == "ping":
                    answers = [
                        response(
                            req.id,
                            pong=pb.Pong(version="fake", protocol_version=1,
                                         uptime_ms=self.uptime_ms),
                        )
                    ]
            for answer in answers:
                delay = 0.0
                if isinstance(answer, tuple):
                    delay, answer = answer
                frame = answer if isinstance(answer, bytes) else answer.SerializeToString()
                heapq.heappush(pending, (time.monotonic() + delay, next(self._seq), identity,
                                         frame))
