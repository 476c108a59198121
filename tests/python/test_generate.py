"""The Python client against a real corrald serving the tiny stories260K model.

Expected texts and token ids come from the shared reference data (llama.cpp's output on the same
files), never from this client or daemon: greedy decoding of "Once upon a time" must reproduce
``reference/stories260K.greedy.txt`` byte for byte, and tokenizing it
``reference/stories260K.greedy.prompt_ids.txt``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import read_shared_ids, read_shared_text, shared_path
from conftest import stories_config as stories_config_text
from corral import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    InvalidArgument,
    ModelState,
    NotFound,
    PermissionDenied,
    Priority,
    Result,
    StopReason,
)

PROMPT = "Once upon a time"
GREEDY = {"temperature": 0.0, "max_tokens": 256}


@pytest.fixture(scope="module")
def reference() -> str:
    return read_shared_text("reference/stories260K.greedy.txt")


@pytest.fixture(scope="module")
def reference_ids() -> list[int]:
    return read_shared_ids("reference/stories260K.greedy.ids.txt")


@pytest.fixture(scope="module")
def prompt_ids() -> list[int]:
    return read_shared_ids("reference/stories260K.greedy.prompt_ids.txt")


def wait_until_idle(c: Client, seconds: float = 3.0) -> None:
    """Poll status until no request is active or queued; fail with the last status otherwise."""
    end = time.monotonic() + seconds
    while True:
        st = c.status()
        busy = st.daemon.active + st.daemon.queued
        busy += sum(m.active + m.queue_depth for m in st.models)
        if busy == 0:
            return
        if time.monotonic() > end:
            pytest.fail(f"the daemon still has requests in flight after {seconds:g} s: {st}")
        time.sleep(0.02)


# --- generation -----------------------------------------------------------------------------


def test_greedy_matches_reference(stories, reference, reference_ids, prompt_ids):
    with Client(stories.endpoint, timeout=10) as c:
        assert c.generate("stories", PROMPT, **GREEDY) == reference
        r = c.generate("stories", PROMPT, return_done=True, **GREEDY)
    assert isinstance(r, Result) and r.text == reference
    d = r.done
    # The reference stops after 256 tokens, not at an end-of-generation token.
    assert len(reference_ids) == 256
    assert d.stop_reason is StopReason.MAX_TOKENS
    assert d.generated_tokens == 256
    assert d.prompt_tokens == len(prompt_ids)
    assert d.prefilled_tokens == len(prompt_ids)  # no session: everything is run
    assert d.model == "stories"
    t = d.timings
    assert t.total_us > 0 and t.decode_us > 0
    assert t.total_us >= t.queue_us + t.prefill_us + t.decode_us


def test_stream_chunks_concatenate_to_reference(stories, reference, reference_ids):
    with Client(stories.endpoint, timeout=10) as c:
        s = c.generate("stories", PROMPT, stream=True, **GREEDY)
        assert s.done is None
        chunks = list(s)
    assert [k.index for k in chunks] == list(range(len(chunks)))
    assert "".join(k.text for k in chunks) == reference
    assert [t for k in chunks for t in k.token_ids] == reference_ids
    assert s.done is not None and s.done.generated_tokens == 256
    assert s.done.stop_reason == "max_tokens"


def test_async_client_matches_reference(stories, reference, reference_ids):
    async def main() -> None:
        async with AsyncClient(stories.endpoint, timeout=10) as c:
            assert await c.generate("stories", PROMPT, **GREEDY) == reference
            s = await c.generate("stories", PROMPT, stream=True, **GREEDY)
            chunks = [k async for k in s]
            assert [k.index for k in chunks] == list(range(len(chunks)))
            assert "".join(k.text for k in chunks) == reference
            assert [t for k in chunks for t in k.token_ids] == reference_ids
            assert s.done is not None and s.done.stop_reason is StopReason.MAX_TOKENS
            # Two generations in flight at once on one client.
            texts = await asyncio.gather(
                c.generate("stories", PROMPT, **GREEDY),
                c.generate("stories", PROMPT, priority="background", **GREEDY),
            )
            assert texts == [reference, reference]

    asyncio.run(main())


def test_two_concurrent_streams_on_one_client(stories, reference):
    other = "Tom and Lily went to the park"
    with Client(stories.endpoint, timeout=10) as c:
        solo = c.generate("stories", other, temperature=0.0, max_tokens=64)
        a = c.generate("stories", PROMPT, stream=True, **GREEDY)
        b = c.generate("stories", other, stream=True, temperature=0.0, max_tokens=64)
        texts = {"a": [], "b": []}
        live = {"a": a, "b": b}
        while live:  # read the two in turns, one chunk each
            for name, s in list(live.items()):
                try:
                    texts[name].append(next(s).text)
                except StopIteration:
                    del live[name]
        st = c.status()  # a third request on the same connection afterwards
    assert "".join(texts["a"]) == reference
    assert "".join(texts["b"]) == solo
    assert st.model("stories").requests_served >= 3


def test_status_between_chunks(stories, reference):
    with Client(stories.endpoint, timeout=10) as c:
        with c.generate("stories", PROMPT, stream=True, **GREEDY) as s:
            first = next(s)
            st = c.status("stories")
            rest = [k.text for k in s]
    assert [m.name for m in st.models] == ["stories"]
    assert first.text + "".join(rest) == reference


def long_config() -> str:
    """stories260K with its full context: 2000 tokens take long enough (and overflow ZeroMQ's
    1000-message queue, so the daemon pauses the stream) that a Cancel always arrives first."""
    return (
        "models:\n"
        "  - name: stories-long\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 2048\n"
    )


LONG = {"temperature": 0.0, "max_tokens": 2000}


def test_breaking_out_of_a_stream_cancels(start_corrald):
    daemon = start_corrald(long_config())
    with Client(daemon.endpoint, timeout=10) as c:
        with c.generate("stories-long", PROMPT, stream=True, **LONG) as s:
            for k in s:
                if k.index == 1:
                    break
        assert s.done is not None, "closing the stream waits for Done"
        assert s.done.stop_reason is StopReason.CANCELLED, (
            f"the generation ended with {s.done.stop_reason} after "
            f"{s.done.generated_tokens} tokens, not cancelled"
        )
        assert s.done.generated_tokens < 2000
        wait_until_idle(c)
        # A stream dropped without closing is cancelled too.
        for k in c.generate("stories-long", PROMPT, stream=True, **LONG):
            break
        wait_until_idle(c)
        st = c.status("stories-long").models[0]
        assert st.requests_served == 2
        assert c.generate("stories-long", PROMPT, temperature=0.0, max_tokens=8)  # still serving


def test_async_task_cancellation_cancels_the_generation(start_corrald):
    daemon = start_corrald(long_config())

    async def main() -> None:
        async with AsyncClient(daemon.endpoint, timeout=10) as c:
            task = asyncio.ensure_future(c.generate("stories-long", PROMPT, **LONG))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            s = await c.generate("stories-long", PROMPT, stream=True, **LONG)
            async with s:
                async for k in s:
                    break
            assert s.done is not None and s.done.stop_reason is StopReason.CANCELLED

    asyncio.run(main())
    with Client(daemon.endpoint, timeout=10) as c:
        wait_until_idle(c)


def test_cancel_by_request_id(start_corrald):
    daemon = start_corrald(long_config())
    with Client(daemon.endpoint, timeout=10) as c:
        s = c.generate("stories-long", PROMPT, stream=True, **LONG)
        next(s)
        assert isinstance(c.cancel(s.request_id), str)
        list(s)
        assert s.done is not None and s.done.stop_reason is StopReason.CANCELLED
        with pytest.raises(NotFound):
            c.cancel(s.request_id)  # no longer in flight
        with pytest.raises(NotFound):
            c.cancel(123456)


def test_stop_string_and_max_tokens(stories, reference):
    with Client(stories.endpoint, timeout=10) as c:
        r = c.generate("stories", PROMPT, stop=["Lily"], return_done=True, **GREEDY)
        short = c.generate("stories", PROMPT, temperature=0.0, max_tokens=10, return_done=True)
    assert r.text == reference[: reference.index("Lily")]
    assert r.done.stop_reason is StopReason.STOP_STRING
    assert short.done.generated_tokens == 10 and short.done.stop_reason == "max_tokens"
    assert reference.startswith(short.text) and len(short.text) > 0


def test_seeded_sampling_is_reproducible(stories):
    opts = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_tokens": 48}
    with Client(stories.endpoint, timeout=10) as c:
        first = c.generate("stories", PROMPT, **opts)
        second = c.generate("stories", PROMPT, **opts)
        other = c.generate("stories", PROMPT, **{**opts, "seed": 99})
    assert first == second
    assert first != other  # 48 sampled tokens at temperature 0.9: identical would be a bug


def test_priorities_do_not_change_greedy_text(stories, reference):
    with Client(stories.endpoint, timeout=10) as c:
        for priority in (Priority.BACKGROUND, "interactive"):
            assert c.generate("stories", PROMPT, priority=priority, **GREEDY) == reference


def test_deadline(start_corrald):
    daemon = start_corrald(long_config())
    with Client(daemon.endpoint, timeout=10) as c:
        with pytest.raises(DeadlineExceeded, match="deadline"):
            c.generate("stories-long", PROMPT, deadline_ms=1, **LONG)
        wait_until_idle(c)
        # A generous deadline changes nothing.
        r = c.generate("stories-long", PROMPT, deadline_ms=60_000, return_done=True, **GREEDY)
        assert r.done.generated_tokens == 256


def apps_config() -> str:
    return (
        stories_config_text()
        + "apps:\n"
        + "  - name: speaker\n"
        + "    models: [stories]\n"
        + "    max_priority: realtime\n"
        + "  - name: editor\n"
        + "    models: [stories, stories-q4]\n"
    )


def test_apps_sessions_and_priorities(start_corrald, reference):
    daemon = start_corrald(apps_config())
    with Client(daemon.endpoint, app="speaker", timeout=10) as speaker, Client(
        daemon.endpoint, app="editor", timeout=10
    ) as editor:
        assert speaker.generate("stories", PROMPT, priority="realtime", **GREEDY) == reference
        with pytest.raises(PermissionDenied, match="stories-q4"):
            speaker.generate("stories-q4", PROMPT, max_tokens=4)
        speaker.generate("stories", PROMPT, session="mine", max_tokens=4)
        # The session is speaker's: editor naming it is refused, and it is still there.
        with pytest.raises(PermissionDenied, match="session 'mine' belongs to another app"):
            editor.generate("stories", PROMPT, session="mine", max_tokens=4)
        r = speaker.generate("stories", PROMPT, session="mine", max_tokens=4, return_done=True)
        assert r.done.prefilled_tokens < r.done.prompt_tokens
        with pytest.raises(PermissionDenied, match="priority realtime: its ceiling is interactive"):
            editor.generate("stories", PROMPT, priority="realtime", max_tokens=4)
        assert editor.generate("stories-q4", PROMPT, max_tokens=4) is not None


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        ({"model": "nope"}, NotFound, "nope"),
        ({"temperature": -1.0}, InvalidArgument, "temperature"),
        ({"top_p": 1.5}, InvalidArgument, "top_p"),
        ({"max_tokens": 0}, InvalidArgument, "max_tokens"),
        ({"max_tokens": 513}, InvalidArgument, "max_tokens"),
        ({"prompt": ""}, InvalidArgument, "prompt"),
        ({"messages": [("user", "hi")]}, InvalidArgument, "prompt"),  # both prompt and messages
        ({"prompt": None, "messages": [("robot", "hi")]}, InvalidArgument, "robot"),
    ],
)
def test_errors_map_to_exception_classes(stories, kwargs, exc, words):
    args = {"model": "stories", "prompt": PROMPT, **kwargs}
    with Client(stories.endpoint, timeout=10) as c:
        with pytest.raises(exc, match=words) as info:
            c.generate(**args)
        assert info.value.message  # the daemon's explanation
        # The same error from a stream, at its first next().
        s = c.generate(**args, stream=True)
        with pytest.raises(exc):
            next(s)
        assert c.ping()  # the connection is fine afterwards


def test_prompt_longer_than_context(stories):
    long_prompt = "Once upon a time there was a big dog. " * 80
    with Client(stories.endpoint, timeout=10) as c:
        n = len(c.tokenize("stories", long_prompt))
        assert n > 512
        with pytest.raises(InvalidArgument) as info:
            c.generate("stories", long_prompt, max_tokens=8)
    # The message says how many tokens against what context.
    assert str(n) in info.value.message and "512" in info.value.message


def test_async_errors(stories):
    async def main() -> None:
        async with AsyncClient(stories.endpoint, timeout=10) as c:
            with pytest.raises(NotFound):
                await c.generate("nope", PROMPT)
            with pytest.raises(InvalidArgument):
                await c.generate("stories", PROMPT, temperature=-1.0)
            with pytest.raises(NotFound):
                await c.tokenize("nope", "x")

    asyncio.run(main())


# --- tokenize, models, status -------------------------------------------------------------


def test_tokenize_matches_reference(stories, prompt_ids):
    with Client(stories.endpoint, timeout=10) as c:
        t = c.tokenize("stories", PROMPT)
        bare = c.tokenize("stories", PROMPT, add_special=False)
        with pytest.raises(NotFound, match="nope"):
            c.tokenize("nope", PROMPT)
    assert list(t.ids) == prompt_ids
    assert len(t.pieces) == len(t.ids) and len(t) == len(prompt_ids)
    assert list(bare.ids) == prompt_ids[1:]  # the same without BOS
    assert "".join(bare.pieces).replace("\u2581", " ").strip() == PROMPT


def test_list_models(stories):
    with Client(stories.endpoint, timeout=10) as c:
        models = {m.name: m for m in c.list_models()}
        c.load("stories")
        loaded = {m.name: m for m in c.list_models()}["stories"]
    assert set(models) == {"stories", "stories-q4"}
    s = models["stories"]
    assert s.path.endswith("stories260K.gguf") and models["stories-q4"].path.endswith(
        "stories260K-q4_0.gguf"
    )
    assert s.context == 512 and models["stories-q4"].context == 512
    assert s.state is ModelState.UNLOADED  # loads on first use
    assert s.pinned is False
    assert loaded.arch == "llama" and loaded.state is ModelState.RESIDENT
    assert loaded.chat_template == "none"  # stories260K has no chat template
    # Until a model is loaded only a template named in the config is known (proto ModelInfo).
    assert s.chat_template == ""


def test_load_unload_pin_unpin_and_status(stories):
    with Client(stories.endpoint, timeout=10) as c:
        st = c.status()
        assert {m.name for m in st.models} == {"stories", "stories-q4"}
        assert st.model("stories").state is ModelState.UNLOADED
        assert st.daemon.version and st.daemon.threads >= 1

        assert isinstance(c.load("stories"), str)
        st = c.status("stories")
        assert [m.name for m in st.models] == ["stories"]
        assert st.models[0].state is ModelState.RESIDENT and st.models[0].bytes > 0
        assert st.daemon.total_bytes >= st.models[0].bytes
        assert {m.name: m for m in c.list_models()}["stories"].arch == "llama"

        c.pin("stories")
        assert c.status("stories").models[0].pinned
        assert {m.name: m for m in c.list_models()}["stories"].pinned
        c.unpin("stories")
        assert not c.status("stories").models[0].pinned

        c.generate("stories", PROMPT, temperature=0.0, max_tokens=4)
        served = c.status("stories").models[0]
        assert served.requests_served == 1 and served.last_used_ms > 0

        c.unload("stories")
        st = c.status("stories")
        assert st.models[0].state is ModelState.UNLOADED
        assert c.status("stories-q4").models[0].state is ModelState.UNLOADED

        for call in (c.load, c.unload, c.pin, c.unpin, c.status):
            with pytest.raises(NotFound, match="nope"):
                call("nope")


def test_q4_model_serves(stories):
    ref = read_shared_text("reference/stories260K-q4_0.greedy.txt")
    with Client(stories.endpoint, timeout=10) as c:
        r = c.generate("stories-q4", PROMPT, temperature=0.0, max_tokens=16, return_done=True)
    assert r.done.model == "stories-q4" and r.done.generated_tokens == 16
    # llama.cpp's smallest greedy margin on this file is at step 82: the first 16 steps are safe.
    assert ref.startswith(r.text)


# --- chat and sessions ----------------------------------------------------------------------


def test_chat_without_template_is_raw_completion(stories):
    with Client(stories.endpoint, timeout=10) as c:
        n_prompt = len(c.tokenize("stories", PROMPT))
        r = c.chat(
            "stories",
            [{"role": "user", "content": PROMPT}],
            temperature=0.0,
            max_tokens=32,
            return_done=True,
        )
        pairs = c.chat(
            "stories",
            [("system", "Once upon"), ("user", " a time")],
            temperature=0.0,
            max_tokens=32,
            return_done=True,
        )
        streamed = list(
            c.chat("stories", [("user", PROMPT)], temperature=0.0, max_tokens=32, stream=True)
        )
    assert isinstance(r.text, str) and r.text
    assert r.done.generated_tokens == 32 and r.done.stop_reason == "max_tokens"
    # The "none" template concatenates the contents: the model sees the same tokens as the
    # raw prompt.
    assert r.done.prompt_tokens == n_prompt
    assert pairs.done.prompt_tokens == n_prompt
    assert "".join(k.text for k in streamed) == r.text


def test_session_keeps_context(stories):
    with Client(stories.endpoint, timeout=10) as c:
        first = c.generate(
            "stories", PROMPT, session="tale", temperature=0.0, max_tokens=24, return_done=True
        )
        assert first.done.prefilled_tokens == first.done.prompt_tokens
        second_prompt = PROMPT + first.text + " Then"
        second = c.generate(
            "stories",
            second_prompt,
            session="tale",
            temperature=0.0,
            max_tokens=8,
            return_done=True,
        )
        st = c.status("stories")
        # Without the session the same prompt is run in full.
        fresh = c.generate(
            "stories", second_prompt, temperature=0.0, max_tokens=8, return_done=True
        )
    d = second.done
    assert d.prompt_tokens > first.done.prompt_tokens
    assert d.prefilled_tokens < d.prompt_tokens, (
        f"the session's cache was not used: {d.prefilled_tokens} of {d.prompt_tokens} prefilled"
    )
    assert fresh.done.prefilled_tokens == fresh.done.prompt_tokens == d.prompt_tokens
    assert second.text == fresh.text  # reusing the cache does not change the result
    assert st.models[0].sessions >= 1 and st.daemon.sessions >= 1
