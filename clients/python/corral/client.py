"""Synchronous client for corrald over ZeroMQ (a DEALER socket; one frame per message).

Several requests may be in flight on one :class:`Client` (two :class:`Stream` objects read in
turns, a :meth:`Client.status` call between two chunks): answers are routed by request id.

Timeouts. Quick requests (ping, tokenize, list_models, status, pin, unpin, cancel) must be
answered within ``timeout`` seconds. Requests that may wait on work (generate and chat, where a
request can sit in the queue behind others or generate for minutes without a message; load;
unload, which waits for requests in flight) are patient: they fail only when the daemon has sent
*nothing at all* for ``timeout`` seconds, neither an answer nor a Pong to the keepalive Pings the
client sends every 5 s (or every ``timeout / 3`` when shorter) while it waits. A live daemon
therefore never trips a patient timeout; to bound a generation's total time give ``deadline_ms``
(enforced by the daemon, queueing included). Either way the failure is
:class:`~corral.errors.DeadlineExceeded`, naming the endpoint.

When the connection drops while requests are in flight (the daemon stopped, crashed or
restarted), they fail at once with :class:`~corral.errors.Unavailable`.
"""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import (
    Any,
    Callable,
    Iterable,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Union,
    overload,
)

import zmq

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

__all__ = ["Client", "Stream", "Pong"]


class Stream(Iterator[Chunk]):
    """The chunks of a streamed generation, as they come: ``generate(..., stream=True)``.

    The request is sent when the stream is created, so several streams run at once; errors
    (unknown model, bad parameter) are raised by the first :func:`next`. Iteration ends when the
    daemon sends Done, which is then in :attr:`done`. Progress messages (its model's load, a
    long prompt's prefill) are not yielded; the latest is in :attr:`progress`.

    Stopping early cancels the generation: leave a ``with`` block, or call :meth:`close`, and the
    client sends Cancel and waits for the final Done (``done.stop_reason`` is then usually
    ``"cancelled"``). A stream dropped without closing (``for c in client.generate(...,
    stream=True): break``) sends Cancel when it is garbage-collected, without waiting.

    A stream belongs to its client and shares its thread: see :class:`Client`.
    """

    def __init__(self, client: "Client", request_id: int, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._finished = False
        #: The id of the Generate request (what :meth:`Client.cancel` takes).
        self.request_id = request_id
        #: How the generation ended; None until the daemon's Done arrived.
        self.done: Optional[Done] = None
        #: The latest Progress (its model's load, its prompt's prefill), if the daemon sent any.
        self.progress: Optional[Progress] = None
        #: Called with every Progress as it is read (set it before the first chunk is read to see
        #: them all: the model's load, merge and repack, then the prompt's prefill).
        self.on_progress: Optional[Callable[[Progress], None]] = None

    def __iter__(self) -> "Stream":
        """The stream itself."""
        return self

    def __next__(self) -> Chunk:
        """The next chunk; StopIteration after Done; the request's error if it failed."""
        while not self._finished:
            resp = self._receive()
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
        raise StopIteration

    def _receive(self) -> Any:
        try:
            return self._client._wait(self.request_id, self._timeout, True)
        except BaseException:
            self._abandon()
            raise

    def _finish(self) -> None:
        self._finished = True
        self._client._demux.forget(self.request_id)

    def _abandon(self) -> None:
        """Cancel without waiting (errors, interrupts, garbage collection)."""
        if not self._finished:
            self._finish()
            self._client._send_cancel_nowait(self.request_id)

    def close(self) -> None:
        """Cancel the generation if it is still running and wait for its end; then :attr:`done`
        holds the daemon's Done. Safe to call twice. The generation's own final error (e.g.
        CANCELLED when it had not started yet) is not raised: it is over either way. What the
        client itself detects is: DeadlineExceeded when the daemon stays silent."""
        if self._finished:
            return
        self._client._send_cancel_nowait(self.request_id)
        while not self._finished:
            self._settle(self._receive())

    def _settle(self, resp: Any) -> None:
        """Take one Response of a stream being closed: chunks are dropped, Done is kept."""
        body = _codec.body_of(resp)
        if body in ("chunk", "progress"):
            return
        self._finish()
        if body == "done":
            self.done = _codec.decode_done(resp.done)
        elif body != "error":
            raise ProtocolError(f"unexpected answer to generate: {body}")

    def __enter__(self) -> "Stream":
        """The stream itself; leaving the block closes it (see :meth:`close`)."""
        return self

    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Close the stream; when an exception is on its way, cancel without waiting."""
        if exc_type is None:
            self.close()
        else:
            self._abandon()

    def __del__(self) -> None:
        try:
            self._abandon()
        except Exception:  # the client or the interpreter may already be gone
            pass


class Client:
    """A connection to corrald.

    ``endpoint`` defaults to :func:`~corral.default_endpoint` (``$CORRAL_ENDPOINT`` or the
    daemon's default socket); ``app`` selects which app to act as, among those corrald lets this
    client be (empty: its default; corrald establishes who the client is, SECURITY.md);
    ``server_key`` (or ``server_key_file``) and ``client_key_file`` are the CURVE keys a tcp
    endpoint needs (default: ``$CORRAL_SERVER_KEY`` or ``$CORRAL_SERVER_KEY_FILE``, and
    ``$CORRAL_CLIENT_KEY_FILE``); a connection corrald refuses makes every call raise
    :class:`~corral.PermissionDenied` at once. ``timeout`` (seconds, ``math.inf`` for none) is
    the default for every call: the time to the answer for quick requests, the daemon's longest
    silence for generations, load and unload (see the module documentation). Connecting does not
    wait for the daemon; the first call does.

    A Client is **not thread-safe**: use one per thread (they are cheap), or guard it with a lock.
    Keepalive Pings are sent only while a call of this client is waiting, so a stream left unread
    for longer than the daemon's peer timeout (30 s by default) is cancelled by the daemon. For
    that pattern use :class:`~corral.AsyncClient`, which pings in the background.

    Use it as a context manager, or call :meth:`close`.
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
        # One process-wide context (thread-safe; one I/O thread) keeps clients cheap.
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IPV6, 1)  # tcp://[::1]:PORT as well as IPv4 addresses
        if keys is not None:
            _auth.set_curve(self._sock, keys)
        # Disconnections tell that requests in flight are lost (see the module documentation);
        # failed handshakes that corrald refused the connection.
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_CONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_DISCONNECTED
            | _auth.HANDSHAKE_EVENTS
        )
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise Unavailable(f"cannot connect to {self.endpoint!r}: {exc}") from exc

    def close(self) -> None:
        """Close the connection. Safe to call twice. Requests still in flight are cancelled by
        the daemon when it notices the connection is gone."""
        if not self._sock.closed:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return bool(self._sock.closed)

    def __enter__(self) -> "Client":
        """The client itself; leaving the block closes it."""
        return self

    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Close the client."""
        self.close()

    # --- transport -------------------------------------------------------------------------

    def _send(self, request_id: int, **body: Any) -> None:
        if self._sock.closed:
            raise Unavailable(f"the client for {self.endpoint} is closed")
        self._read_monitor()
        if self._refused is not None:
            raise self._refused
        data = _codec.new_request(request_id, self.app, **body).SerializeToString()
        try:
            self._sock.send(data, zmq.NOBLOCK)
        except zmq.Again:
            self._read_monitor()  # no connection to queue on: a refused one is gone for good
            if self._refused is not None:
                raise self._refused from None
            raise Unavailable(
                f"cannot send to corrald at {self.endpoint}: too many messages are waiting "
                "(is it running?)"
            ) from None
        self._demux.sent(time.monotonic())

    def _start(self, **body: Any) -> int:
        """Send a request whose answers are collected; returns its id."""
        rid = self._demux.open()
        try:
            self._send(rid, **body)
        except BaseException:
            self._demux.forget(rid)
            raise
        return rid

    def _send_cancel_nowait(self, request_id: int) -> None:
        """Fire-and-forget Cancel (its Ack, or NOT_FOUND when the request just ended, is
        dropped)."""
        if not self._sock.closed:
            try:
                self._send(self._demux.new_id(), cancel=pb.Cancel(request_id=request_id))
            except CorralError:
                pass  # a full queue means the daemon is gone; it cancels on its own

    def _send_keepalive(self, now: float) -> None:
        try:
            self._send(self._demux.keepalive_id(), ping=pb.Ping())
        except Unavailable:
            self._demux.sent(now)  # a full queue: the silence timeout will tell; do not spin

    def _wait(self, request_id: int, timeout: float, patient: bool) -> Any:
        """The next Response for ``request_id``, reading (and routing) frames as they come and
        pinging while waiting. DeadlineExceeded after ``timeout`` seconds without the answer,
        or, when ``patient``, of silence from the daemon."""
        box = self._demux.inboxes.get(request_id)
        if box is None:
            raise ProtocolError(f"request {request_id} is not in flight on this client")
        interval = _codec.ping_interval(timeout)
        start = time.monotonic()
        while not box:
            if self._sock.closed:
                raise Unavailable(f"the client for {self.endpoint} is closed")
            now = time.monotonic()
            since = max(start, self._demux.last_heard) if patient else start
            if now - since >= timeout:
                raise _codec.silence_error(self.endpoint, timeout)
            connect_by = self._demux.connect_deadline(now)
            if connect_by is not None:
                self._read_monitor()  # news the last poll did not wait for
                if self._demux.not_running(now):
                    raise _codec.not_running_error(self.endpoint)
                connect_by = self._demux.connect_deadline(now)
            if now - self._demux.last_sent >= interval:
                self._send_keepalive(now)
            until = min(since + timeout, self._demux.last_sent + interval)
            if connect_by is not None and connect_by > now:
                until = min(until, connect_by)  # (after it, a failed attempt wakes the poll)
            wait_ms = max(1, math.ceil((until - now) * 1000))
            ready = dict(self._poller.poll(wait_ms))
            if self._sock in ready:
                self._drain()
            if self._monitor in ready:
                self._read_monitor()
        return box.popleft()

    def _drain(self) -> None:
        while True:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._demux.feed(frame, time.monotonic())

    def _read_monitor(self) -> None:
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = _codec.monitor_event(frames)
            if event == zmq.EVENT_CONNECTED:
                self._demux.connected = True
                continue
            if event == zmq.EVENT_CONNECT_RETRIED:
                self._demux.connect_failed()
                continue
            if event == zmq.EVENT_DISCONNECTED:
                self._drain()  # answers that arrived before the drop still count
                self._demux.connection_lost()
                continue
            why = _auth.refusal(self.endpoint, event, _auth.event_value(frames), self._curve)
            if why is not None:
                self._demux.refused(*why)
                if _auth.final(event):
                    self._refused = _codec.error_of(*why)

    def _call(
        self,
        what: str,
        reply: str,
        timeout: Optional[float],
        patient: bool = False,
        progress: Optional[Callable[[Progress], None]] = None,
        **body: Any,
    ) -> Any:
        """One request, one reply: the reply's ``reply`` body, or the error raised. Progress
        messages before the reply (a Load or Pin that asked) go to ``progress``."""
        limit = _codec.resolve_timeout(timeout, self.timeout)
        rid = self._start(**body)
        try:
            while True:
                resp = self._wait(rid, limit, patient)
                if _codec.body_of(resp) != "progress":
                    break
                if progress is not None:
                    progress(_codec.decode_progress(resp.progress))
        finally:
            self._demux.forget(rid)
        return _codec.expect(resp, reply, what)

    # --- requests --------------------------------------------------------------------------

    def ping(self, timeout: Optional[float] = None) -> Pong:
        """Check that the daemon is alive; returns its version, protocol revision and uptime."""
        return _codec.decode_pong(self._call("ping", "pong", timeout, ping=pb.Ping()))

    @overload
    def generate(
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
    def generate(
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
    def generate(
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
    ) -> Stream: ...

    @overload
    def generate(
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
    ) -> Union[str, Result, Stream]: ...

    def generate(
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
    ) -> Union[str, Result, Stream]:
        """Generate text with ``model`` from a raw ``prompt`` or a chat (``messages``; exactly one
        of the two). Every parameter left at None is "not set": the model's configured default
        applies, then the engine's.

        Sampling: ``temperature`` (0 = greedy), ``top_k``, ``top_p``, ``min_p``,
        ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``, ``penalty_last_n``,
        ``seed``; ``max_tokens`` to generate; ``stop``: a string or a list of strings to stop
        before. ``priority``: ``"realtime"``, ``"interactive"``, ``"background"`` (or a
        :class:`~corral.Priority`). ``session``: keep this conversation's state in the daemon so
        the next request sharing its beginning only runs what is new (the session is this app's:
        another app naming the id gets PermissionDenied). ``deadline_ms``: the
        daemon gives up after this long (DeadlineExceeded). ``regex``: the whole output must
        match it (constrained decoding). ``json_schema``: the output is a JSON document that this
        JSON Schema validates (structured output; a dict, or its JSON text; ``{"type":
        "json_object"}`` for any object); not together with ``regex``. A schema the daemon cannot
        honour raises :class:`~corral.InvalidArgument` naming the place in the schema
        (``json schema: #/properties/age/multipleOf: ...``). Stopping by ``max_tokens`` can cut
        the document: check ``done.stop_reason``. ``sanitizer``, ``template``: config profile and
        chat template names overriding the model's. ``timeout``: seconds of daemon silence before
        DeadlineExceeded (default: the client's).

        Returns the generated text (without the prompt); with ``return_done=True`` a
        :class:`~corral.Result` holding the text and the :class:`~corral.Done` (stop reason,
        token counts, timings); with ``stream=True`` a :class:`Stream` of
        :class:`~corral.Chunk` objects whose ``done`` is set once it is exhausted.

        Raises the exception of the daemon's error code (:class:`~corral.NotFound` for an unknown
        model, :class:`~corral.InvalidArgument` for bad parameters, ...); TypeError for arguments
        of the wrong type. An interrupted call (KeyboardInterrupt) cancels the generation.
        """
        if stream and return_done:
            raise TypeError("return_done applies to stream=False; a Stream has .done instead")
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
        s = Stream(self, self._start(generate=gen), limit)
        if stream:
            return s
        with s:
            text = "".join(chunk.text for chunk in s)
        if s.done is None:  # pragma: no cover - iteration only ends at Done
            raise ProtocolError("generation ended without Done")
        return Result(text, s.done) if return_done else text

    @overload
    def chat(
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
    def chat(
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
    def chat(
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
    ) -> Stream: ...

    @overload
    def chat(
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
    ) -> Union[str, Result, Stream]: ...

    def chat(
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
    ) -> Union[str, Result, Stream]:
        """Continue a chat: ``messages`` are dicts ``{"role": ..., "content": ...}`` or
        ``(role, content)`` tuples, rendered with the model's chat template (or ``template``)
        plus the assistant's turn. The other parameters and the result are :meth:`generate`'s.
        """
        return self.generate(
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

    def tokenize(
        self, model: str, text: str, *, add_special: bool = True, timeout: Optional[float] = None
    ) -> Tokens:
        """Tokenize ``text`` as ``model`` does for a raw prompt (special-token text is never
        parsed). ``add_special`` adds BOS/EOS as the model does for prompts (default True, so
        ``len(result)`` is what a prompt costs)."""
        msg = pb.Tokenize(
            model=_codec.check_str("model", model),
            text=_codec.check_str("text", text),
            add_special=bool(add_special),
        )
        return _codec.decode_tokens(self._call("tokenize", "tokenize", timeout, tokenize=msg))

    def list_models(self, *, timeout: Optional[float] = None) -> List[ModelInfo]:
        """Every configured model with its file, context, chat template and residency."""
        reply = self._call("list_models", "models", timeout, list_models=pb.ListModels())
        return _codec.decode_models(reply)

    def status(
        self, model: Optional[str] = None, *, timeout: Optional[float] = None
    ) -> StatusReply:
        """The daemon's state, and that of ``model`` (every model when None): memory, queues,
        requests being computed, sessions. An unknown model raises NotFound."""
        msg = pb.Status(model="" if model is None else _codec.check_str("model", model))
        return _codec.decode_status(self._call("status", "status", timeout, status=msg))

    def load(
        self,
        model: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[Progress], None]] = None,
    ) -> str:
        """Load ``model`` now (it otherwise loads on first use); returns when it is resident,
        with the daemon's acknowledgement text. The timeout is patient (see the module
        documentation): loading a big model takes as long as it takes. ``progress`` (a callable
        taking a :class:`~corral.Progress`) is called with each report of the load: loading,
        merging a variant's adapters, rearranging the weights."""
        msg = pb.Load(model=_codec.check_str("model", model), progress=progress is not None)
        return str(self._call("load", "ack", timeout, True, progress, load=msg).message)

    def unload(self, model: str, *, force: bool = False, timeout: Optional[float] = None) -> str:
        """Release ``model``'s memory (requests in flight finish first, so the timeout is
        patient; its sessions are dropped); returns the daemon's acknowledgement text. A pinned
        model is refused (FailedPrecondition naming the pin) unless ``force``, which unpins it
        first."""
        msg = pb.Unload(model=_codec.check_str("model", model), force=bool(force))
        return str(self._call("unload", "ack", timeout, True, unload=msg).message)

    def pin(
        self,
        model: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[Progress], None]] = None,
    ) -> str:
        """Load ``model`` (as :meth:`load`, so the timeout is patient) and keep it: it is never
        unloaded or swapped out to make room. Returns when it is resident and pinned."""
        msg = pb.Pin(model=_codec.check_str("model", model), progress=progress is not None)
        return str(self._call("pin", "ack", timeout, True, progress, pin=msg).message)

    def unpin(self, model: str, *, timeout: Optional[float] = None) -> str:
        """Undo :meth:`pin`."""
        msg = pb.Unpin(model=_codec.check_str("model", model))
        return str(self._call("unpin", "ack", timeout, unpin=msg).message)

    def cancel(self, request_id: int, *, timeout: Optional[float] = None) -> str:
        """Cancel this client's request ``request_id`` (e.g. :attr:`Stream.request_id`): it ends
        with Done(stop_reason "cancelled"), or the error CANCELLED if it had not started.
        Raises NotFound when no such request is in flight. Closing a :class:`Stream` does this
        for you."""
        msg = pb.Cancel(request_id=_codec.check_int("request_id", request_id, 0, 2**64 - 1))
        return str(self._call("cancel", "ack", timeout, cancel=msg).message)
