"""The client's own mechanics against a scripted fake daemon (fakedaemon.py): how parameters are
encoded, demultiplexing of concurrent requests, keepalive pings, silence timeouts, restarts,
cancellation on break and on task cancellation, and answers a correct daemon never sends."""

from __future__ import annotations

import asyncio
import gc
import math
import time

import pytest

from corral import (
    AsyncClient,
    Client,
    CorralError,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    Priority,
    ProtocolError,
    StopReason,
    Unavailable,
)
from corral._proto import pb
from fakedaemon import FakeDaemon, error, response


def done(request_id: int, reason: int = pb.STOP_REASON_EOG, **fields: int) -> pb.Response:
    return response(request_id, done=pb.Done(stop_reason=reason, model="fake", **fields))


def chunk(request_id: int, index: int, text: str) -> pb.Response:
    return response(request_id, chunk=pb.Chunk(text=text, index=index, token_ids=[index + 100]))


def echo_generator(fake: FakeDaemon, req: pb.Request):
    """Generate: the prompt's characters as chunks, one every 10 ms; Cancel: Ack, then
    Done(CANCELLED) for the cancelled request (as corrald does)."""
    body = req.WhichOneof("body")
    if body == "generate":
        out = [(0.01 * i, chunk(req.id, i, ch)) for i, ch in enumerate(req.generate.prompt)]
        return out + [(0.01 * len(out), done(req.id, generated_tokens=len(out)))]
    if body == "cancel":
        cancelled = done(req.cancel.request_id, pb.STOP_REASON_CANCELLED)
        return [response(req.id, ack=pb.Ack()), cancelled]
    return None


# --- encoding -------------------------------------------------------------------------------


def test_every_generate_parameter_is_encoded():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, app="speaker", timeout=2) as c:
        c.generate(
            "m",
            "hi",
            max_tokens=7,
            temperature=0.0,
            top_k=0,
            top_p=0.5,
            min_p=0.25,
            repeat_penalty=1.5,
            presence_penalty=-0.5,
            frequency_penalty=0.125,
            penalty_last_n=64,
            seed=2**64 - 1,
            stop="END",
            priority="Realtime",
            session="s1",
            deadline_ms=1500,
            regex="[a-z]+",
            sanitizer="strict",
            template="chatml",
        )
        (req,) = fake.received("generate")
    g = req.generate
    assert req.app == "speaker" and req.protocol_version == pb.PROTOCOL_VERSION_CURRENT
    assert (g.model, g.prompt, len(g.messages)) == ("m", "hi", 0)
    # Zero values are present: "set to 0" differs from "not set".
    for name in ("temperature", "top_k"):
        assert g.HasField(name), name
    assert g.temperature.value == 0.0 and g.top_k.value == 0
    assert g.max_tokens.value == 7 and g.top_p.value == 0.5 and g.min_p.value == 0.25
    assert g.repeat_penalty.value == 1.5 and g.presence_penalty.value == -0.5
    assert g.frequency_penalty.value == 0.125 and g.penalty_last_n.value == 64
    assert g.seed.value == 2**64 - 1
    assert list(g.stop) == ["END"]
    assert g.priority == pb.PRIORITY_REALTIME
    assert (g.session, g.deadline_ms, g.constraint) == ("s1", 1500, "[a-z]+")
    assert (g.sanitizer, g.template, g.stream) == ("strict", "chatml", False)


def test_unset_parameters_stay_absent():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        c.chat("m", [{"role": "system", "content": "be brief"}, ("user", "hi")], stream=False)
        (req,) = fake.received("generate")
    g = req.generate
    for name in (
        "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
        "presence_penalty", "frequency_penalty", "penalty_last_n", "seed",
    ):
        assert not g.HasField(name), name
    assert g.prompt == "" and g.priority == pb.PRIORITY_UNSPECIFIED
    assert [(m.role, m.content) for m in g.messages] == [("system", "be brief"), ("user", "hi")]
    assert (g.session, g.deadline_ms, g.constraint, list(g.stop)) == ("", 0, "", [])


@pytest.mark.parametrize(
    "priority,wire",
    [
        (Priority.BACKGROUND, pb.PRIORITY_BACKGROUND),
        ("interactive", pb.PRIORITY_INTERACTIVE),
        (pb.PRIORITY_REALTIME, pb.PRIORITY_REALTIME),
        (None, pb.PRIORITY_UNSPECIFIED),
    ],
)
def test_priority_forms(priority, wire):
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        c.generate("m", "x", priority=priority)
        assert fake.received("generate")[0].generate.priority == wire


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        ({"max_tokens": -1}, InvalidArgument, "max_tokens"),
        ({"seed": -5}, InvalidArgument, "seed"),
        ({"top_k": 2**31}, InvalidArgument, "top_k"),
        ({"deadline_ms": 2**32}, InvalidArgument, "deadline_ms"),
        ({"priority": "urgent"}, InvalidArgument, "urgent"),
        ({"priority": 42}, InvalidArgument, "42"),
        ({"max_tokens": 1.5}, TypeError, "max_tokens"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"messages": [("user",)]}, TypeError, "messages[0]"),
        ({"messages": [{"role": "user"}]}, TypeError, "content"),
        ({"messages": {"role": "user", "content": "x"}}, TypeError, "sequence"),
        ({"stop": ["ok", 3]}, TypeError, "stop"),
        ({"stream": True, "return_done": True}, TypeError, "return_done"),
        ({"timeout": 0}, InvalidArgument, "timeout"),
    ],
)
def test_bad_arguments_are_refused_before_sending(kwargs, exc, words):
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        with pytest.raises(exc, match=words.replace("[", r"\[").replace("]", r"\]")):
            c.generate("m", "x", **kwargs)
        assert fake.received("generate") == []
    assert issubclass(InvalidArgument, ValueError)


# --- results and demultiplexing -------------------------------------------------------------


def test_result_and_stream_shapes():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        r = c.generate("m", "abc", return_done=True)
        assert r.text == "abc" and r.done.stop_reason is StopReason.EOG
        assert r.done.stop_reason == "eog" and r.done.generated_tokens == 3
        s = c.generate("m", "xyz", stream=True)
        assert s.done is None
        chunks = list(s)
        assert [(k.text, k.index, k.token_ids) for k in chunks] == [
            ("x", 0, (100,)), ("y", 1, (101,)), ("z", 2, (102,))
        ]
        assert s.done is not None and s.done.model == "fake"
        assert list(s) == []  # exhausted for good
        assert fake.received("generate")[1].generate.stream is True


def test_two_streams_read_in_any_order_get_their_own_chunks():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        a = c.generate("m", "aaaa", stream=True)
        b = c.generate("m", "bbbbbb", stream=True)
        assert a.request_id != b.request_id
        # Read b completely first: a's chunks arrive meanwhile and must be kept for a.
        assert "".join(k.text for k in b) == "bbbbbb"
        status_req = c.generate("m", "cc")  # a third request between the two
        assert status_req == "cc"
        assert [k.index for k in a] == [0, 1, 2, 3]
        assert a.done is not None and b.done is not None


def test_replies_for_abandoned_requests_are_ignored():
    def slow_status(fake, req):
        if req.WhichOneof("body") == "status":
            return [(0.2, response(req.id, status=pb.StatusReply()))]
        return None

    with FakeDaemon(slow_status) as fake, Client(fake.endpoint, timeout=0.1) as c:
        with pytest.raises(DeadlineExceeded):
            c.status()
        time.sleep(0.15)  # the late StatusReply arrives now, for an abandoned id
        assert c.ping(timeout=1).version == "fake"


# --- liveness ---------------------------------------------------------------------------------


def test_patient_calls_ping_and_a_live_daemon_never_times_out():
    # The answers come after 0.4 s, twice the timeout: the keepalive Pongs keep the calls alive.
    def slow(fake, req):
        body = req.WhichOneof("body")
        if body == "load":
            return [(0.4, response(req.id, ack=pb.Ack(message="loaded")))]
        if body == "generate":
            return [(0.4, chunk(req.id, 0, "late")), (0.4, done(req.id))]
        return None

    with FakeDaemon(slow) as fake, Client(fake.endpoint, timeout=0.2) as c:
        assert c.load("m") == "loaded"
        pings = fake.received("ping")
        assert c.generate("m", "x") == "late"
    assert len(pings) >= 3  # one every timeout / 3 = 0.067 s
    assert len({p.id for p in pings}) == len(pings)


def test_quick_calls_time_out_even_when_the_daemon_answers_pings():
    def never(fake, req):
        return [] if req.WhichOneof("body") == "status" else None

    with FakeDaemon(never) as fake, Client(fake.endpoint, timeout=0.3) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=fake.endpoint):
            c.status()
        assert time.monotonic() - start < 1.0


def test_silent_daemon_times_out_naming_the_endpoint():
    def mute(fake, req):
        return []

    with FakeDaemon(mute) as fake, Client(fake.endpoint, timeout=0.3) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="is it running") as info:
            c.generate("m", "x")
        took = time.monotonic() - start
        assert fake.endpoint in str(info.value)
        assert 0.25 <= took < 1.0
        assert fake.received("ping")  # it did try


def test_a_dropped_connection_fails_requests_in_flight_at_once():
    def mute_generate(fake, req):
        return [] if req.WhichOneof("body") == "generate" else None

    with FakeDaemon(mute_generate) as fake, Client(fake.endpoint, timeout=10) as c:
        assert c.ping().version == "fake"  # connected
        s = c.generate("m", "x", stream=True)
        fake.wait_for("generate")
        start = time.monotonic()
        fake.restart()
        with pytest.raises(Unavailable, match="connection to corrald .* was lost"):
            next(s)
        assert time.monotonic() - start < 2.0  # not the 10 s timeout
        assert c.ping().version == "fake"  # reconnected to the new daemon


def test_async_dropped_connection_fails_requests_in_flight_at_once():
    def mute_generate(fake, req):
        return [] if req.WhichOneof("body") == "generate" else None

    async def main(fake: FakeDaemon):
        async with AsyncClient(fake.endpoint, timeout=10) as c:
            await c.ping()
            task = asyncio.ensure_future(c.generate("m", "x"))
            await asyncio.get_running_loop().run_in_executor(None, fake.wait_for, "generate")
            fake.restart()
            with pytest.raises(Unavailable, match="was lost"):
                await asyncio.wait_for(task, 2.0)
            assert (await c.ping()).version == "fake"

    with FakeDaemon(mute_generate) as fake:
        asyncio.run(main(fake))


# --- cancellation -----------------------------------------------------------------------------


def test_leaving_a_with_block_cancels_and_waits_for_done():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        with c.generate("m", "x" * 50, stream=True) as s:
            for k in s:
                if k.index == 2:
                    break
        (cancel,) = fake.received("cancel")
        assert cancel.cancel.request_id == s.request_id
        assert s.done is not None and s.done.stop_reason == "cancelled"
        assert c.generate("m", "ok") == "ok"  # the connection is clean afterwards


def test_a_dropped_stream_sends_cancel():
    with FakeDaemon(echo_generator) as fake, Client(fake.endpoint, timeout=2) as c:
        for k in c.generate("m", "y" * 50, stream=True):
            break
        gc.collect()
        (cancel,) = fake.wait_for("cancel")
        assert cancel.cancel.request_id == fake.received("generate")[0].id
        assert c.generate("m", "ok") == "ok"


def test_cancel_by_id_and_unknown_id():
    def gen(fake, req):
        if req.WhichOneof("body") == "cancel" and req.cancel.request_id == 999:
            return [error(req.id, pb.NOT_FOUND, "no request 999 of this client is in flight")]
        return echo_generator(fake, req)

    with FakeDaemon(gen) as fake, Client(fake.endpoint, timeout=2) as c:
        s = c.generate("m", "z" * 50, stream=True)
        next(s)
        c.cancel(s.request_id)
        rest = list(s)
        assert len(rest) < 49 and s.done.stop_reason is StopReason.CANCELLED
        with pytest.raises(NotFound, match="999"):
            c.cancel(999)


# --- answers a correct daemon does not send ---------------------------------------------------


def test_error_with_id_zero_reaches_the_waiting_call():
    def bad(fake, req):
        if req.WhichOneof("body") == "status":
            return [error(0, pb.PROTOCOL, "message is not a valid corral.v1.Request")]
        return None

    with FakeDaemon(bad) as fake, Client(fake.endpoint, timeout=1) as c:
        with pytest.raises(ProtocolError, match="not a valid"):
            c.status()


def test_undecodable_and_unexpected_answers_raise_protocol_error():
    def garbage(fake, req):
        body = req.WhichOneof("body")
        if body == "status":
            return [b"\xff\xff\xff not protobuf"]
        if body == "load":
            return [response(req.id, pong=pb.Pong())]
        if body == "unload":
            return [error(req.id, 99, "from the future")]
        return None

    with FakeDaemon(garbage) as fake, Client(fake.endpoint, timeout=1) as c:
        with pytest.raises(ProtocolError, match="undecodable"):
            c.status()
        with pytest.raises(ProtocolError, match="unexpected answer to load: pong"):
            c.load("m")
        with pytest.raises(CorralError) as info:
            c.unload("m")
        assert info.value.code == "ERROR_99" and info.value.message == "from the future"


def test_a_bad_reply_fails_only_its_own_request():
    """A reply that does not decode (an Error whose message is not UTF-8, as a faulty daemon
    could send) fails the request whose id it carries; a stream in flight reads on."""
    def handler(fake, req):
        if req.WhichOneof("body") == "status":
            # Response{id, error: Error{message: b"\xff\xfe"}}: field 10 holding field 2.
            return [response(req.id).SerializeToString() + b"\x52\x04\x12\x02\xff\xfe"]
        return echo_generator(fake, req)

    with FakeDaemon(handler) as fake, Client(fake.endpoint, timeout=2) as c:
        s = c.generate("m", "abcdef", stream=True)
        first = next(s)
        with pytest.raises(ProtocolError, match="undecodable response .* to request"):
            c.status()
        assert first.text + "".join(k.text for k in s) == "abcdef"
        assert s.done is not None
        assert c.ping() is not None


def test_the_drop_of_a_refused_connection_fails_no_later_request():
    """libzmq reports a refused handshake, then its connection's drop; when the drop is read
    only after the next call was sent (on the connection libzmq retries), that call must get
    the retried connection's answer, not UNAVAILABLE for a drop already reported as the refusal
    (seen once in CI: test_access.py's refused tcp client, second call)."""
    from corral._demux import Demux

    d = Demux("tcp://127.0.0.1:1")
    first = d.open()
    assert d.refused(pb.PERMISSION_DENIED, "tcp needs CURVE keys") == {first}
    assert d.inboxes[first][0].error.code == pb.PERMISSION_DENIED
    d.forget(first)
    second = d.open()
    assert d.connection_lost() == set()  # the refused connection's drop
    assert not d.inboxes[second]
    # A drop after that is a real one.
    assert d.connection_lost() == {second}
    assert d.inboxes[second][0].error.code == pb.UNAVAILABLE


def test_closed_client_raises_unavailable():
    with FakeDaemon() as fake:
        c = Client(fake.endpoint, timeout=1)
        c.close()
        c.close()
        assert c.closed
        with pytest.raises(Unavailable, match="closed"):
            c.ping()


# --- asyncio ----------------------------------------------------------------------------------


def test_async_concurrent_generations_and_stream():
    async def main(endpoint: str):
        async with AsyncClient(endpoint, timeout=2) as c:
            texts = await asyncio.gather(*(c.generate("m", p) for p in ("abc", "defgh", "ij")))
            assert texts == ["abc", "defgh", "ij"]
            r = await c.generate("m", "xy", return_done=True)
            assert r.text == "xy" and r.done.stop_reason == "eog"
            s = await c.generate("m", "stream", stream=True)
            got = [k async for k in s]
            assert "".join(k.text for k in got) == "stream"
            assert [k.index for k in got] == list(range(6)) and s.done is not None

    with FakeDaemon(echo_generator) as fake:
        asyncio.run(main(fake.endpoint))


def test_async_cancelling_the_task_sends_cancel():
    async def main(fake: FakeDaemon):
        async with AsyncClient(fake.endpoint, timeout=2) as c:
            task = asyncio.ensure_future(c.generate("m", "q" * 100))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (cancel,) = await asyncio.get_running_loop().run_in_executor(
                None, fake.wait_for, "cancel"
            )
            assert cancel.cancel.request_id == fake.received("generate")[0].id
            async with await c.generate("m", "w" * 100, stream=True) as s:
                async for k in s:
                    break
            assert s.done is not None and s.done.stop_reason is StopReason.CANCELLED

    with FakeDaemon(echo_generator) as fake:
        asyncio.run(main(fake))


def test_async_keepalive_runs_while_a_stream_is_not_read():
    async def main(fake: FakeDaemon):
        async with AsyncClient(fake.endpoint, timeout=0.2) as c:
            s = await c.generate("m", "abc", stream=True)
            await asyncio.sleep(0.35)  # nobody awaits the stream: the keepalive task pings
            assert len(fake.received("ping")) >= 3
            assert "".join([k.text async for k in s]) == "abc"
            n = len(fake.received("ping"))
            await asyncio.sleep(0.2)  # nothing in flight: no more pings
            assert len(fake.received("ping")) == n

    with FakeDaemon(echo_generator) as fake:
        asyncio.run(main(fake))


def test_async_errors_and_silence():
    def handler(fake, req):
        body = req.WhichOneof("body")
        if body == "generate":
            return [error(req.id, pb.NOT_FOUND, f"model '{req.generate.model}' is not configured")]
        if body == "status":
            return []
        if body == "ping":
            return []
        return None

    async def main(endpoint: str):
        async with AsyncClient(endpoint, timeout=0.2) as c:
            with pytest.raises(NotFound, match="'nope' is not configured"):
                await c.generate("nope", "x")
            s = await c.generate("nope", "x", stream=True)
            with pytest.raises(NotFound):
                await s.__anext__()
            with pytest.raises(DeadlineExceeded, match=endpoint):
                await c.status()

    with FakeDaemon(handler) as fake:
        asyncio.run(main(fake.endpoint))


def test_no_daemon_async_times_out_with_a_clear_error(tmp_path):
    async def main():
        async with AsyncClient(f"ipc://{tmp_path}/nobody.sock", timeout=0.2) as c:
            with pytest.raises(DeadlineExceeded, match="is it running"):
                await c.ping()

    asyncio.run(main())


def test_timeout_inf_is_accepted():
    with FakeDaemon() as fake, Client(fake.endpoint, timeout=math.inf) as c:
        assert c.ping().version == "fake"


def test_async_client_survives_a_second_event_loop():
    with FakeDaemon(echo_generator) as fake:
        c = AsyncClient(fake.endpoint, timeout=math.inf)  # created outside any loop
        assert asyncio.run(c.generate("m", "one")) == "one"
        assert asyncio.run(c.generate("m", "two")) == "two"
        asyncio.run(c.close())
        assert c.closed


def test_closing_swallows_the_generations_own_final_error():
    # A generation still queued ends with Error CANCELLED; a deadline may pass meanwhile too.
    def queued(fake, req):
        body = req.WhichOneof("body")
        if body == "generate":
            return [chunk(req.id, 0, "a")]
        if body == "cancel":
            code = pb.CANCELLED if len(fake.received("cancel")) == 1 else pb.DEADLINE_EXCEEDED
            return [response(req.id, ack=pb.Ack()), error(req.cancel.request_id, code, "over")]
        return None

    async def in_async(endpoint: str) -> None:
        async with AsyncClient(endpoint, timeout=2) as c:
            async with await c.generate("m", "x", stream=True) as s:
                async for _ in s:
                    break
            assert s.done is None

    with FakeDaemon(queued) as fake, Client(fake.endpoint, timeout=2) as c:
        for _ in range(2):
            with c.generate("m", "x", stream=True) as s:
                next(s)
            assert s.done is None
        asyncio.run(in_async(fake.endpoint))
