"""asyncio client for corrald (``zmq.asyncio``): :class:`AsyncClient` and :class:`AsyncStream`.

The same requests, results and errors as :class:`corral.Client`, as coroutines. One background
reader task routes every answer to the request it belongs to, so any number of requests may be
in flight at once (``asyncio.gather`` over several ``generate`` calls on one client works), and a
keepalive task pings the daemon every 5 s (or ``timeout / 3``) while any request is in flight,
even when nobody is awaiting it. Timeouts mean what they mean in the sync client
(:mod:`corral.client`): the time to the answer for quick requests, the daemon's longest silence
for generations, load and unload; a dropped connection fails the requests in flight with
Unavailable at once.

Cancelling the task awaiting a generation (``asyncio.wait_for``, ``task.cancel()``) sends Cancel
to the daemon.
"""

from __future__ import annotations

import asyncio
import math
import time
from types import TracebackType
from typing import (
    Any,
    Callable,
    AsyncIterator,
    Dict,
    Iterable,
    List,
    Literal,
    Optional,
    Sequence,
    Union,
    cast,
    overload,
)

import zmq
import zmq.asyncio

from . import _auth, _codec
from ._codec import JsonSchemaLike, PriorityLike
from ._demux import Demux
from ._proto import pb
from .endpoint import default_endpoint
from .errors import CorralError, ProtocolError, Unavailable
from .types import (
    ChatMessage,
    Chunk,
    Done,
    ModelInfo,
    Pong,
    Progress,
    Result,
    StatusReply,
    Tokens,
)

__all__ = ["AsyncClient", "AsyncStream"]


async def _wait_event(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` pass, whichever comes first. Not
    ``asyncio.wait_for``: before Python 3.12 it swallows the task's cancellation when the event
    is set in the same loop iteration (a message arriving as the caller cancels), and the
    cancelled generation would then run to its end."""
    timer = asyncio.get_running_loop().call_later(seconds, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


class AsyncStream(AsyncIterator[Chunk]):
    """The chunks of a streamed generation: ``await client.generate(..., stream=True)``.

    Iterate with ``async for``. The request is sent when the stream is created; errors are
    raised by the first ``__anext__``. When iteration ends, :attr:`done` holds the daemon's Done;
    :attr:`progress` the latest prefill Progress.

    Stopping early cancels the generation: leave an ``async with`` block or ``await`` :meth:`aclose`
    (sends Cancel and waits for the final Done). A stream dropped without closing sends Cancel when
    it is garbage-collected, without waiting.
    """

    def __init__(self, client: "AsyncClient", request_id: int, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._finished = False
        #: The id of the Generate request (what :meth:`AsyncClient.cancel` takes).
        self.request_id = request_id
        #: How the generation ended; None until the daemon's Done arrived.
        self.done: Optional[Done] = None
        #: The latest Progress (its model's load, its prompt's prefill), if the daemon sent any.
        self.progress: Optional[Progress] = None
        #: Called with every Progress as it is read (set it before the first chunk is read to see
        #: them all: the model's load, merge and repack, then the prompt's prefill).
        self.on_progress: Optional[Callable[[Progress], None]] = None

    def __aiter__(self) -> "AsyncStream":
        """The stream itself."""
        return self

    async def __anext__(self) -> Chunk:
        """The next chunk; StopAsyncIteration after Done; the request's error if it failed."""
        while not self._finished:
            resp = await self._receive()
            body = _codec.body_of(resp)
            if body == "chunk":
                return _codec.decode_chunk(resp.chunk)
            if body == "progress":
                self.progress = _codec.decode_progress(resp.progress)
                if self.on_progress is not None:
                    self.on_progress(self.progress)
                continue
            self._finish()
            if body == "done":
                self.done = _codec.decode_done(resp.done)
                break
            if body == "error":
                _codec.raise_error(resp)
            raise ProtocolError(f"unexpected answer to generate: {body}")
        raise StopAsyncIteration

    async def _receive(self) -> Any:
        try:
            return await self._client._wait(self.request_id, self._timeout, True)
        except BaseException:  # includes task cancellation: the daemon must stop too
            self._abandon()
            raise

    def _finish(self) -> None:
        self._finished = True
        self._client._forget(self.request_id)

    def _abandon(self) -> None:
        """Cancel without waiting (errors, task cancellation, garbage collection)."""
        if not self._finished:
            self._finish()
            self._client._send_cancel_nowait(self.request_id)

    async def aclose(self) -> None:
        """Cancel the generation if it is still running and wait for its end; then :attr:`done`
        holds the daemon's Done. Safe to call twice. The generation's own final error (e.g.
        CANCELLED) is not raised: it is over either way. DeadlineExceeded is, when the daemon
        stays silent."""
        if self._finished:
            return
        self._client._send_cancel_nowait(self.request_id)
        while not self._finished:
            resp = await self._receive()
            body = _codec.body_of(resp)
            if body in ("chunk", "progress"):
                continue
            self._finish()
            if body == "done":
                self.done = _codec.decode_done(resp.done)
            elif body != "error":
                raise ProtocolError(f"unexpected answer to generate: {body}")

    async def __aenter__(self) -> "AsyncStream":
        """The stream itself; leaving the block closes it (see :meth:`aclose`)."""
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Close the stream; when an exception is on its way, cancel without waiting."""
        if exc_type is None:
            await self.aclose()
        else:
            self._abandon()

    def __del__(self) -> None:
        try:
            self._abandon()
        except Exception:  # the client, its loop or the interpreter may already be gone
            pass


class AsyncClient:
    """An asyncio connection to corrald.

    Arguments as :class:`corral.Client`. Create it anywhere; use it from one event loop at a
    time (its tasks start with the first request, and again in a new loop). Like every asyncio
    object it is not thread-safe.
    Use ``async with AsyncClient() as c:``, or ``await c.close()``.
    """

    def __init__(
        self,
        endpoint: Optional[str] = None,
        app: str = "",
        timeout: float = 30.0,
        *,
        server_key: Optional[str] = None,
        server_key_file: Optional[str] = None,
        client_key_file: Optional[str] = None,
    ) -> None:
        #: The endpoint this client talks to.
        self.endpoint: str = endpoint or default_endpoint()
        keys = _auth.curve_keys(self.endpoint, server_key, server_key_file, client_key_file)
        self._curve = keys is not None
        # Why corrald refused the connection for good (libzmq does not retry it), once it did.
        self._refused: Optional[CorralError] = None
        #: The app name sent with every request.
        self.app: str = app
        #: Default timeout of every call, in seconds (see the module documentation).
        self.timeout: float = _codec.resolve_timeout(None, timeout)
        self._demux = Demux(self.endpoint)
        self._events: Dict[int, asyncio.Event] = {}
        self._limits: Dict[int, float] = {}
        self._reader: Optional["asyncio.Task[None]"] = None
        self._keeper: Optional["asyncio.Task[None]"] = None
        self._wake: Optional[asyncio.Event] = None
        self._failure: Optional[BaseException] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IPV6, 1)  # tcp://[::1]:PORT as well as IPv4 addresses
        if keys is not None:
            _auth.set_curve(self._sock, keys)
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_CONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_DISCONNECTED
            | _auth.HANDSHAKE_EVENTS
        )
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise Unavailable(f"cannot connect to {self.endpoint!r}: {exc}") from exc

    def _close_sockets(self) -> None:
        if not self._sock.closed:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return bool(self._sock.closed)

    async def close(self) -> None:
        """Stop the background tasks and close the connection. Safe to call twice. Calls still
        waiting raise Unavailable; the daemon cancels what was in flight."""
        loop = asyncio.get_running_loop()
        # Tasks of an earlier event loop died with it (and cannot be touched any more).
        tasks = [
            t for t in (self._reader, self._keeper) if t is not None and t.get_loop() is loop
        ]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._reader = self._keeper = None
        self._close_sockets()
        for ev in self._events.values():
            ev.set()

    async def __aenter__(self) -> "AsyncClient":
        """The client itself; leaving the block closes it."""
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Close the client."""
        await self.close()

    # --- transport -------------------------------------------------------------------------

    def _ensure_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is not None and not self._reader.done() and self._loop is loop:
            return
        # First use, or a new event loop (a second asyncio.run): the old tasks died with theirs.
        self._loop = loop
        self._failure = None
        self._wake = asyncio.Event()
        self._reader = loop.create_task(self._read_loop())
        self._keeper = loop.create_task(self._keepalive_loop())

    def _send(self, request_id: int, **body: Any) -> None:
        if self._sock.closed:
            raise Unavailable(f"the client for {self.endpoint} is closed")
        if self._refused is not None:
            raise self._refused
        data = _codec.new_request(request_id, self.app, **body).SerializeToString()
        # With NOBLOCK and no send already queued, pyzmq completes the future on the spot.
        fut: Any = self._sock.send(data, zmq.NOBLOCK)
        if fut.done() and fut.exception() is not None:
            if self._refused is not None:
                raise self._refused
            raise Unavailable(
                f"cannot send to corrald at {self.endpoint}: too many messages are waiting "
                "(is it running?)"
            )
        self._demux.sent(time.monotonic())

    def _start(self, limit: float, **body: Any) -> int:
        """Send a request whose answers are collected; returns its id."""
        self._ensure_tasks()
        rid = self._demux.open()
        self._events[rid] = asyncio.Event()
        self._limits[rid] = limit
        try:
            self._send(rid, **body)
        except BaseException:
            self._forget(rid)
            raise
        assert self._wake is not None
        self._wake.set()  # the keepalive task recomputes its interval
        return rid

    def _forget(self, rid: int) -> None:
        self._demux.forget(rid)
        self._events.pop(rid, None)
        self._limits.pop(rid, None)

    def _send_cancel_nowait(self, request_id: int) -> None:
        """Fire-and-forget Cancel; only possible from a running event loop."""
        if self._sock.closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # garbage collection outside the loop: the daemon cancels on disconnect
        try:
            self._send(self._demux.new_id(), cancel=pb.Cancel(request_id=request_id))
        except CorralError:
            pass

    async def _wait(self, request_id: int, timeout: float, patient: bool) -> Any:
        """The next Response for ``request_id``; DeadlineExceeded after ``timeout`` seconds
        without it, or, when ``patient``, of silence from the daemon."""
        box = self._demux.inboxes.get(request_id)
        event = self._events.get(request_id)
        if box is None or event is None:
            raise ProtocolError(f"request {request_id} is not in flight on this client")
        start = time.monotonic()
        while not box:
            if self._sock.closed:
                raise Unavailable(f"the client for {self.endpoint} is closed")
            if self._failure is not None:
                raise Unavailable(
                    f"the connection to corrald at {self.endpoint} failed: {self._failure!r}"
                ) from self._failure
            since = max(start, self._demux.last_heard) if patient else start
            now = time.monotonic()
            left = since + timeout - now
            if left <= 0:
                raise _codec.silence_error(self.endpoint, timeout)
            connect_by = self._demux.connect_deadline(now)
            if connect_by is not None:
                if self._demux.not_running(now):
                    raise _codec.not_running_error(self.endpoint)
                if connect_by > now:  # (after it, a failed attempt wakes the waiter)
                    left = min(left, connect_by - now)
            event.clear()
            if math.isinf(left):
                await event.wait()
                continue
            await _wait_event(event, left)
        return box.popleft()

    def _wake_up(self, ids: Iterable[int]) -> None:
        for rid in ids:
            event = self._events.get(rid)
            if event is not None:
                event.set()

    async def _drain(self) -> None:
        while True:
            try:
                frame = await self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._wake_up(self._demux.feed(cast(bytes, frame), time.monotonic()))

    async def _read_loop(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if self._sock in ready:
                    await self._drain()
                if self._monitor in ready:
                    frames = await self._monitor.recv_multipart()
                    event = _codec.monitor_event(frames)
                    if event == zmq.EVENT_CONNECTED:
                        self._demux.connected = True
                        continue
                    if event == zmq.EVENT_CONNECT_RETRIED:
                        self._wake_up(self._demux.connect_failed())
                        continue
                    if event == zmq.EVENT_DISCONNECTED:
                        await self._drain()  # answers that arrived before the drop still count
                        self._wake_up(self._demux.connection_lost())
                        continue
                    why = _auth.refusal(
                        self.endpoint, event, _auth.event_value(frames), self._curve
                    )
                    if why is not None:
                        if _auth.final(event):
                            self._refused = _codec.error_of(*why)
                        self._wake_up(self._demux.refused(*why))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the socket was closed or broke: wake every waiter
            self._failure = exc
            self._wake_up(list(self._events))

    async def _keepalive_loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self._limits:
                self._wake.clear()
                await self._wake.wait()
                continue
            interval = _codec.ping_interval(min(self._limits.values()))
            now = time.monotonic()
            due = self._demux.last_sent + interval
            if now >= due:
                try:
                    self._send(self._demux.keepalive_id(), ping=pb.Ping())
                except Unavailable:
                    self._demux.sent(now)  # the silence timeout will tell; do not spin
                continue
            self._wake.clear()
            await _wait_event(self._wake, due - now)

    async def _call(
        self,
        what: str,
        reply: str,
        timeout: Optional[float],
        patient: bool = False,
        progress: Optional[Callable[[Progress], None]] = None,
        **body: Any,
    ) -> Any:
        limit = _codec.resolve_timeout(timeout, self.timeout)
        rid = self._start(limit, **body)
        try:
            while True:
                resp = await self._wait(rid, limit, patient)
                if _codec.body_of(resp) != "progress":
                    break
                if progress is not None:
                    progress(_codec.decode_progress(resp.progress))
        finally:
            self._forget(rid)
        return _codec.expect(resp, reply, what)

    # --- requests --------------------------------------------------------------------------

    async def ping(self, timeout: Optional[float] = None) -> Pong:
        """Check that the daemon is alive; returns its version, protocol revision and uptime."""
        return _codec.decode_pong(await self._call("ping", "pong", timeout, ping=pb.Ping()))

    @overload
    async def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Iterable[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[False] = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[False] = False,
    ) -> str: ...

    @overload
    async def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Iterable[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[False] = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[True],
    ) -> Result: ...

    @overload
    async def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Iterable[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[True],
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[False] = False,
    ) -> AsyncStream: ...

    @overload
    async def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Iterable[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: bool = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: bool = False,
    ) -> Union[str, Result, AsyncStream]: ...

    async def generate(
        self,
        model: str,
        prompt: Optional[str] = None,
        *,
        messages: Optional[Iterable[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: bool = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: bool = False,
    ) -> Union[str, Result, AsyncStream]:
        """Generate text: the parameters and results of :meth:`corral.Client.generate`, as a
        coroutine. With ``stream=True`` it returns an :class:`AsyncStream` to iterate with
        ``async for``. Cancelling the awaiting task cancels the generation in the daemon."""
        if stream and return_done:
            raise TypeError("return_done applies to stream=False; a stream has .done instead")
        limit = _codec.resolve_timeout(timeout, self.timeout)
        gen = _codec.make_generate(
            model,
            prompt,
            messages,
            stream=stream,
            priority=priority,
            session=session,
            deadline_ms=deadline_ms,
            regex=regex,
            json_schema=json_schema,
            sanitizer=sanitizer,
            template=template,
            stop=stop,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            penalty_last_n=penalty_last_n,
            seed=seed,
        )
        s = AsyncStream(self, self._start(limit, generate=gen), limit)
        if stream:
            return s
        async with s:
            text = "".join([chunk.text async for chunk in s])
        if s.done is None:  # pragma: no cover - iteration only ends at Done
            raise ProtocolError("generation ended without Done")
        return Result(text, s.done) if return_done else text

    @overload
    async def chat(
        self,
        model: str,
        messages: Iterable[ChatMessage],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[False] = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[False] = False,
    ) -> str: ...

    @overload
    async def chat(
        self,
        model: str,
        messages: Iterable[ChatMessage],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[False] = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[True],
    ) -> Result: ...

    @overload
    async def chat(
        self,
        model: str,
        messages: Iterable[ChatMessage],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: Literal[True],
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: Literal[False] = False,
    ) -> AsyncStream: ...

    @overload
    async def chat(
        self,
        model: str,
        messages: Iterable[ChatMessage],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: bool = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: bool = False,
    ) -> Union[str, Result, AsyncStream]: ...

    async def chat(
        self,
        model: str,
        messages: Iterable[ChatMessage],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Union[str, Sequence[str], None] = None,
        stream: bool = False,
        priority: Optional[PriorityLike] = None,
        session: Optional[str] = None,
        deadline_ms: Optional[int] = None,
        regex: Optional[str] = None,
        json_schema: Optional[JsonSchemaLike] = None,
        sanitizer: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        return_done: bool = False,
    ) -> Union[str, Result, AsyncStream]:
        """Continue a chat: :meth:`corral.Client.chat` as a coroutine."""
        return await self.generate(
            model,
            None,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            penalty_last_n=penalty_last_n,
            seed=seed,
            stop=stop,
            stream=stream,
            priority=priority,
            session=session,
            deadline_ms=deadline_ms,
            regex=regex,
            json_schema=json_schema,
            sanitizer=sanitizer,
            template=template,
            timeout=timeout,
            return_done=return_done,
        )

    async def tokenize(
        self, model: str, text: str, *, add_special: bool = True, timeout: Optional[float] = None
    ) -> Tokens:
        """Tokenize ``text`` as ``model`` does for a raw prompt: see
        :meth:`corral.Client.tokenize`."""
        msg = pb.Tokenize(
            model=_codec.check_str("model", model),
            text=_codec.check_str("text", text),
            add_special=bool(add_special),
        )
        reply = await self._call("tokenize", "tokenize", timeout, tokenize=msg)
        return _codec.decode_tokens(reply)

    async def list_models(self, *, timeout: Optional[float] = None) -> List[ModelInfo]:
        """Every configured model: see :meth:`corral.Client.list_models`."""
        reply = await self._call("list_models", "models", timeout, list_models=pb.ListModels())
        return _codec.decode_models(reply)

    async def status(
        self, model: Optional[str] = None, *, timeout: Optional[float] = None
    ) -> StatusReply:
        """The daemon's state: see :meth:`corral.Client.status`."""
        msg = pb.Status(model="" if model is None else _codec.check_str("model", model))
        return _codec.decode_status(await self._call("status", "status", timeout, status=msg))

    async def load(
        self,
        model: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[Progress], None]] = None,
    ) -> str:
        """Load ``model`` now: see :meth:`corral.Client.load`."""
        msg = pb.Load(model=_codec.check_str("model", model), progress=progress is not None)
        return str((await self._call("load", "ack", timeout, True, progress, load=msg)).message)

    async def unload(
        self, model: str, *, force: bool = False, timeout: Optional[float] = None
    ) -> str:
        """Release ``model``'s memory: see :meth:`corral.Client.unload`."""
        msg = pb.Unload(model=_codec.check_str("model", model), force=bool(force))
        return str((await self._call("unload", "ack", timeout, True, unload=msg)).message)

    async def pin(
        self,
        model: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[Progress], None]] = None,
    ) -> str:
        """Load and pin ``model``: see :meth:`corral.Client.pin`."""
        msg = pb.Pin(model=_codec.check_str("model", model), progress=progress is not None)
        return str((await self._call("pin", "ack", timeout, True, progress, pin=msg)).message)

    async def unpin(self, model: str, *, timeout: Optional[float] = None) -> str:
        """Undo :meth:`pin`."""
        msg = pb.Unpin(model=_codec.check_str("model", model))
        return str((await self._call("unpin", "ack", timeout, unpin=msg)).message)

    async def cancel(self, request_id: int, *, timeout: Optional[float] = None) -> str:
        """Cancel this client's request ``request_id``: see :meth:`corral.Client.cancel`."""
        msg = pb.Cancel(request_id=_codec.check_int("request_id", request_id, 0, 2**64 - 1))
        return str((await self._call("cancel", "ack", timeout, cancel=msg)).message)
