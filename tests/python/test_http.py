"""corrald's HTTP front end at the wire level: headers, SSE and NDJSON framing, stop strings, the
limits (body size, slow clients, bad JSON, invalid UTF-8), bearer keys and the app rules they bring
(models, priority ceiling, admin, rate), sanitizer profiles, errors that asking again cannot mend
(400/500, not 429), CORS, a client that disconnects mid-stream or before a whole answer, shutdown
with a request running, structured output validated with jsonschema, configuration checks, and
greedy output through HTTP equal to `corral run` on the same prompt.

The official clients' tests are in tests/http/ (node); these use raw sockets and http.client so
that every byte the server sends can be checked.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import corrald_path, read_shared_text, running_corrald, shared_path, stories_config

PROMPT = "Once upon a time"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_config(port: int, extra_http: str = "", tail: str = "") -> str:
    """HTTP on `port`, and stories (context 2048, room for long streams) and stories-q4."""
    return (
        "http:\n"
        f'  listen: ["127.0.0.1:{port}"]\n'
        + extra_http
        + stories_config().replace("context: 512", "context: 2048")
        + tail
    )


@pytest.fixture
def api(start_corrald):
    """A corrald serving stories over HTTP (and ZeroMQ); yields (daemon, port)."""
    port = free_port()
    daemon = start_corrald(
        http_config(port, "  max_body_bytes: 4KiB\n  request_timeout_ms: 1500\n"
                          "  idle_timeout_ms: 2000\n  cors: [\"http://app.example\"]\n")
    )
    return daemon, port


def request(port: int, method: str, path: str, body=None, headers=None, host="127.0.0.1"):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                   **(headers or {})})
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r, payload


def send_post(s: socket.socket, path: str, body: bytes, headers: bytes = b"") -> None:
    """Write a POST of `body` to `path` on a raw socket, with `headers` (CRLF-terminated lines)
    after Host, for tests that must control what is read and when."""
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + headers
              + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def error_of(payload: bytes) -> dict:
    doc = json.loads(payload)
    assert set(doc) == {"error"}
    return doc["error"]


def test_greedy_through_http_equals_corral_run(api):
    daemon, port = api
    r = subprocess.run(
        [os.environ["CORRAL"], "--endpoint", daemon.endpoint, "run", "stories", PROMPT, "-n",
         "256", "--temp", "0"],
        capture_output=True, timeout=60, check=True,
    )
    cli_text = r.stdout.decode()
    assert cli_text == read_shared_text("reference/stories260K.greedy.txt")
    resp, payload = request(port, "POST", "/v1/completions",
                            {"model": "stories", "prompt": PROMPT, "max_tokens": 256,
                             "temperature": 0})
    assert resp.status == 200
    assert json.loads(payload)["choices"][0]["text"] == cli_text


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0, "presence_penalty": 1.5},
        {"temperature": 0, "frequency_penalty": 1.5},
        {"temperature": 0.9, "top_p": 0.8, "seed": 7},
    ],
    ids=["presence_penalty", "frequency_penalty", "temperature_top_p_seed"],
)
def test_sampling_fields_reach_the_sampler(api, fields):
    """An OpenAI body's sampling fields change the text exactly as the same settings do over
    ZeroMQ, and the text differs from what the request without them gives (so a field the front
    end dropped would show)."""
    from corral import Client

    daemon, port = api

    def over_http(body_fields: dict) -> str:
        resp, payload = request(port, "POST", "/v1/completions",
                                {"model": "stories", "prompt": PROMPT, "max_tokens": 96,
                                 **body_fields})
        assert resp.status == 200, payload
        return json.loads(payload)["choices"][0]["text"]

    with Client(daemon.endpoint, timeout=60) as c:
        over_zmq = c.generate("stories", PROMPT, max_tokens=96, **fields)
        plain = c.generate("stories", PROMPT, max_tokens=96,
                           temperature=fields["temperature"],
                           **({"seed": 8} if "seed" in fields else {}))
    assert over_http(fields) == over_zmq
    assert over_zmq != plain


def chat_body(**fields) -> dict:
    """A greedy chat request for stories saying PROMPT."""
    return {"model": "stories", "messages": [{"role": "user", "content": PROMPT}],
            "temperature": 0, **fields}


def sse_events(raw: str) -> list[dict]:
    """The JSON events of a whole SSE answer (its `data: [DONE]` checked and left out)."""
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    return [json.loads(e[len("data: "):]) for e in raw.split("\n\n")[:-2]]


def test_chat_stop_ends_the_content_before_the_stop_string(api):
    """`stop` on /v1/chat/completions: the greedy text T without it goes on past the stop string;
    with it the content is T up to (not including) the string's first occurrence, the generation
    ended there (fewer tokens), and finish_reason is "stop". In an array, the string that occurs
    first ends it."""
    _, port = api
    resp, payload = request(port, "POST", "/v1/chat/completions", chat_body(max_tokens=64))
    assert resp.status == 200, payload
    whole = json.loads(payload)
    text = whole["choices"][0]["message"]["content"]
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 64
    for stop, first in [("park", "park"), (["park", "Lily"], "Lily"), ("\n", "\n")]:
        assert first in text and text.index(first) > 0, (first, text)
        resp, payload = request(port, "POST", "/v1/chat/completions",
                                chat_body(max_tokens=64, stop=stop))
        assert resp.status == 200, payload
        doc = json.loads(payload)
        choice = doc["choices"][0]
        assert choice["message"]["content"] == text[: text.index(first)], stop
        assert choice["finish_reason"] == "stop", stop
        assert doc["usage"]["completion_tokens"] < 64, stop


def test_chat_stop_in_a_stream(api):
    """The same through SSE: the deltas join to T cut before the stop string (text held back
    while it might begin the stop string is neither lost nor leaked), and the one final chunk
    says "stop"."""
    _, port = api
    text = json.loads(request(port, "POST", "/v1/chat/completions",
                              chat_body(max_tokens=64))[1])["choices"][0]["message"]["content"]
    stop = " park"
    assert stop in text, text
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions",
                 body=json.dumps(chat_body(max_tokens=64, stop=stop, stream=True)))
    resp = conn.getresponse()
    assert resp.status == 200
    docs = sse_events(resp.read().decode())
    conn.close()
    streamed = "".join(d["choices"][0]["delta"].get("content", "") for d in docs if d["choices"])
    assert streamed == text[: text.index(stop)]
    finals = [d["choices"][0]["finish_reason"] for d in docs
              if d["choices"] and d["choices"][0]["finish_reason"]]
    assert finals == ["stop"]


def test_headers_and_request_id(api):
    _, port = api
    resp, payload = request(port, "GET", "/v1/models", headers={"X-Request-Id": "abc-123"})
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "application/json"
    assert resp.getheader("X-Request-Id") == "abc-123"
    assert json.loads(payload)["data"][0]["id"] == "stories"
    # Without one the server makes one up.
    resp, _ = request(port, "GET", "/v1/models")
    assert resp.getheader("X-Request-Id")
    # No CORS headers for a request without an allowed Origin.
    assert resp.getheader("Access-Control-Allow-Origin") is None


def test_sse_framing(api):
    _, port = api
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": "stories", "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 20, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}))
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/event-stream"
    assert resp.getheader("Transfer-Encoding") == "chunked"
    raw = resp.read().decode()
    conn.close()
    # Every event is one `data: ` line followed by a blank line; the last is [DONE].
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    docs = [json.loads(e[6:]) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(d["object"] == "chat.completion.chunk" for d in docs)
    assert len({d["id"] for d in docs}) == 1
    finals = [d for d in docs if d["choices"] and d["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 20
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in docs if d["choices"])
    whole = json.loads(request(port, "POST", "/v1/chat/completions", {
        "model": "stories", "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 20, "temperature": 0})[1])
    assert text == whole["choices"][0]["message"]["content"]


def test_ndjson_framing(api):
    _, port = api
    resp, payload = request(port, "POST", "/api/generate",
                            {"model": "stories", "prompt": PROMPT, "raw": True,
                             "options": {"num_predict": 16, "temperature": 0}})
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "application/x-ndjson"
    lines = payload.decode().split("\n")
    assert lines[-1] == ""
    docs = [json.loads(line) for line in lines[:-1]]
    assert [d["done"] for d in docs] == [False] * (len(docs) - 1) + [True]
    assert docs[-1]["eval_count"] == 16


def test_body_too_large_is_413(api):
    _, port = api
    resp, payload = request(port, "POST", "/v1/completions",
                            {"model": "stories", "prompt": "x" * 8192})
    assert resp.status == 413
    assert "max_body_bytes" in error_of(payload)["message"]
    # Chunked, so the size is only known while it arrives.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"model": "stories", "prompt": "y" * 8192}).encode()
    conn.request("POST", "/v1/completions", body=iter([body[:4000], body[4000:]]),
                 encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    assert conn.getresponse().status == 413
    conn.close()


def test_bad_json_and_bad_utf8_are_400_naming_the_problem(api):
    _, port = api
    resp, payload = request(port, "POST", "/v1/chat/completions", b'{"model": "stories",')
    assert resp.status == 400
    err = error_of(payload)
    assert "not valid JSON" in err["message"] and "column" in err["message"]
    assert err["type"] == "invalid_request_error"
    bad = b'{"model": "stories", "messages": [{"role": "user", "content": "caf\xe9"}]}'
    resp, payload = request(port, "POST", "/v1/chat/completions", bad)
    assert resp.status == 400
    assert f"not valid UTF-8 (at byte {bad.index(0xE9)})" in error_of(payload)["message"]
    resp, payload = request(port, "POST", "/v1/chat/completions", b"[1, 2]")
    assert resp.status == 400
    assert "JSON object" in error_of(payload)["message"]
    # Ollama's endpoints answer in Ollama's error shape.
    resp, payload = request(port, "POST", "/api/chat", b"{")
    assert resp.status == 400
    assert isinstance(json.loads(payload)["error"], str)


def test_unknown_endpoints_and_methods(api):
    _, port = api
    resp, payload = request(port, "GET", "/v1/nothing")
    assert resp.status == 404
    resp, payload = request(port, "GET", "/v1/chat/completions")
    assert resp.status == 405


def test_slow_loris_headers_are_cut_off(api):
    """A client that trickles its headers is disconnected after http.idle_timeout_ms (2 s here),
    although it sends a byte every 200 ms (which restarts libmicrohttpd's own idle timer)."""
    _, port = api
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    closed = False
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        try:
            s.sendall(b"X")
        except OSError:
            closed = True
            break
        s.settimeout(0.2)
        try:
            if s.recv(4096) == b"":
                closed = True
                break
        except socket.timeout:
            pass
        except OSError:
            closed = True
            break
    s.close()
    assert closed, "the server kept a connection that never finished its headers"


def test_slow_body_is_cut_off(api):
    """A body still arriving http.request_timeout_ms (1.5 s here) after its headers: the
    connection is closed, although the client keeps sending a byte every 100 ms. (The announced
    length is within http.max_body_bytes: a larger one would be a 413 at once.)"""
    daemon, port = api
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = json.dumps({"model": "stories", "prompt": PROMPT}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 2000\r\n\r\n" + body[:5])
    closed = False
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and not closed:
        try:
            s.sendall(b" ")
            s.settimeout(0.1)
            closed = s.recv(4096) == b""
        except socket.timeout:
            pass
        except OSError:
            closed = True
    s.close()
    assert closed, "the server kept a connection whose body never finished"
    assert 'msg="http client too slow to send its body: disconnected"' in daemon.log()


def test_client_disconnect_mid_stream_cancels_the_generation(api):
    """The client reads the first event, then stops reading and closes the connection. Its
    receive buffer is tiny, so the 2,000-token stream (about 600 KB) cannot have been sent whole:
    the generation is still running, or paused because the client does not read, when the
    connection closes — and the daemon must cancel it."""
    daemon, port = api
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = json.dumps({"model": "stories", "messages": [{"role": "user", "content": PROMPT}],
                       "max_tokens": 2000, "temperature": 0, "stream": True}).encode()
    send_post(s, "/v1/chat/completions", body, b"X-Request-Id: gone-1\r\n")
    got = b""
    while b"data: " not in got:
        chunk = s.recv(1024)
        assert chunk, "the stream ended before its first event"
        got += chunk
    s.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [l for l in daemon.log().splitlines()
                 if "client left" in l and "request_id=gone-1" in l]
        if lines:
            break
        time.sleep(0.05)
    assert lines, daemon.log()
    assert "stop=cancelled" in lines[0]


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """A synthetic llama (random weights, 70 M parameters, context 2048) that takes milliseconds
    a token where stories takes a fraction of one: 2,000 tokens of it take seconds, not the second
    stories needs. The file (about 75 MB) is removed after the module."""
    path = tmp_path_factory.mktemp("http-slow") / "slow.gguf"
    subprocess.run(
        [os.environ["CORRAL"], "synth", "--arch", "llama", "--n-embd", "1024", "--n-layer", "6",
         "--n-head", "8", "--n-head-kv", "4", "--n-ff", "2816", "--n-vocab", "512", "--n-ctx",
         "2048", "--type", "q8_0", "--seed", "3", "-o", str(path)],
        check=True, capture_output=True, timeout=300,
    )
    yield path
    path.unlink()


def slow_config(port: int, slow_model) -> str:
    return http_config(port, tail=f"  - name: slow\n    path: {slow_model}\n    context: 2048\n")


def slow_body(stream: bool) -> bytes:
    """2,000 tokens of the slow model: the constraint allows no end of generation before."""
    return json.dumps({"model": "slow", "prompt": PROMPT, "max_tokens": 2000, "temperature": 0,
                       "stream": stream, "corral": {"regex": "(?:[ -~]{1000}){4}"}}).encode()


def wait_until_slow_computes(daemon) -> None:
    """Until the core runs a request of the slow model (Status says it is active)."""
    from corral import Client

    with Client(daemon.endpoint, timeout=30) as c:
        deadline = time.monotonic() + 25
        while c.status("slow").model("slow").active == 0:
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.01)


def test_client_disconnect_before_a_whole_answer_cancels_it(start_corrald, slow_model):
    """A non-streamed request: the client sends it, waits until the core computes it, and closes
    the connection. The daemon notices (it watches the sockets of requests waiting for the core),
    cancels the generation mid-way and logs it."""
    port = free_port()
    daemon = start_corrald(slow_config(port, slow_model))
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    send_post(s, "/v1/completions", slow_body(stream=False),
              b"X-Request-Id: gone-2\r\nContent-Type: application/json\r\n")
    wait_until_slow_computes(daemon)
    s.close()

    def line(*parts: str) -> str | None:
        return next((l for l in daemon.log().splitlines() if all(p in l for p in parts)), None)

    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and not line("ended after its client left", "gone-2"):
        time.sleep(0.05)
    assert line('msg="http client disconnected: cancelling"', "request_id=gone-2"), daemon.log()
    cancelled = line('msg="request cancelled"', "model=slow")
    assert cancelled and "why=gone" in cancelled and "when=running" in cancelled, daemon.log()
    ended = line("ended after its client left", "request_id=gone-2")
    assert ended and "stop=cancelled" in ended, daemon.log()
    generated = int(ended.split("generated_tokens=")[1].split()[0])
    assert generated < 2000, ended


def test_stop_with_http_requests_in_flight():
    """SIGTERM while a stream is stalled (its client stopped reading), a connection idles and
    another is halfway through its headers: corrald still exits 0 within the fixture's 5 s."""
    port = free_port()
    sockets = []
    with running_corrald(http_config(port)) as daemon:
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        body = json.dumps({"model": "stories", "prompt": PROMPT, "max_tokens": 2000,
                           "temperature": 0, "stream": True}).encode()
        send_post(stalled, "/v1/completions", body)
        assert stalled.recv(64).startswith(b"HTTP/1.1 200")
        idle = socket.create_connection(("127.0.0.1", port))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        sockets += [stalled, idle, partial]
        assert daemon.process.poll() is None
    for s in sockets:
        s.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_shutdown_ends_a_running_request_with_503_or_an_error_event(slow_model, stream):
    """SIGTERM while the core computes a request: a whole answer is a 503 naming the shutdown; a
    stream that began with 200 ends with that error as its last event and the chunked terminator."""
    port = free_port()
    with running_corrald(slow_config(port, slow_model)) as daemon:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        send_post(s, "/v1/completions", slow_body(stream), b"Content-Type: application/json\r\n")
        wait_until_slow_computes(daemon)
        daemon.process.send_signal(signal.SIGTERM)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
        s.close()
        assert daemon.process.wait(timeout=30) == 0, daemon.log()
    head, _, payload = raw.partition(b"\r\n\r\n")
    if not stream:
        assert head.startswith(b"HTTP/1.1 503"), raw[:300]
        err = error_of(payload)
    else:
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head, raw[:300]
        assert payload.endswith(b"\r\n0\r\n\r\n"), raw[-300:]
        events = [line[6:] for line in payload.split(b"\n") if line.startswith(b"data: ")]
        assert len(events) >= 2 and b"[DONE]" not in events, raw[-300:]
        err = json.loads(events[-1])["error"]
    assert (err["type"], err["code"]) == ("server_error", "unavailable"), err
    assert "shutting down" in err["message"], err


def open_stalled_stream(port: int, max_tokens: int = 2000) -> socket.socket:
    """A stream whose client reads its headers and then stops reading (a tiny receive buffer):
    its request stays in flight until the socket closes."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = json.dumps({"model": "stories", "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    send_post(s, "/v1/completions", body)
    assert s.recv(64).startswith(b"HTTP/1.1 200")
    return s


def test_deadline_is_408_and_full_queue_is_429(start_corrald):
    port = free_port()
    start_corrald(http_config(port, tail="limits: {queue_per_model: 1}\n"))
    # 2,000 tokens take stories about a second and a half; the deadline is 20 ms.
    resp, payload = request(port, "POST", "/v1/completions",
                            {"model": "stories", "prompt": PROMPT, "max_tokens": 2000,
                             "temperature": 0, "corral": {"deadline_ms": 20}})
    assert resp.status == 408, payload
    err = error_of(payload)
    assert err["type"] == "timeout_error" and "deadline" in err["message"]
    # One request in flight fills the model's queue: the next is refused at once.
    stalled = open_stalled_stream(port)
    try:
        resp, payload = request(port, "POST", "/v1/completions",
                                {"model": "stories", "prompt": PROMPT, "max_tokens": 2})
        assert resp.status == 429, payload
        assert "queue_per_model" in error_of(payload)["message"]
        resp, payload = request(port, "POST", "/api/generate",
                                {"model": "stories", "prompt": PROMPT, "stream": False})
        assert resp.status == 429
        assert "queue_per_model" in json.loads(payload)["error"]
    finally:
        stalled.close()


# A pattern whose repetitions multiply past the compile limits (issue 18's row 1).
HOSTILE_REGEX = "((a|b){0,12}){0,1000}"


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_constraint_over_the_compile_limits_is_400_naming_its_field(api):
    """Asking again gets the same answer: a 400 naming the field, not the 429 of a full queue
    (which OpenAI's SDKs would retry)."""
    _, port = api
    resp, payload = request(port, "POST", "/v1/completions",
                            {"model": "stories", "prompt": PROMPT, "max_tokens": 4,
                             "corral": {"regex": HOSTILE_REGEX}})
    assert resp.status == 400, payload
    err = error_of(payload)
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error", "constraint_too_complex", "corral.regex"), err
    assert "limit" in err["message"], err
    deep = nested_schema(40)
    resp, payload = request(port, "POST", "/v1/chat/completions",
                            chat_body(response_format={"type": "json_schema", "json_schema":
                                                       {"name": "deep", "schema": deep}}))
    assert resp.status == 400, payload
    err = error_of(payload)
    assert (err["code"], err["param"]) == (
        "constraint_too_complex", "response_format.json_schema.schema"), err
    assert "JSON_SCHEMA_MAX_DEPTH" in err["message"], err
    resp, payload = request(port, "POST", "/api/generate",
                            {"model": "stories", "prompt": PROMPT, "stream": False,
                             "format": deep})
    assert resp.status == 400, payload
    assert "JSON_SCHEMA_MAX_DEPTH" in json.loads(payload)["error"]


def test_a_model_that_can_never_fit_is_500_not_429(start_corrald, tmp_path):
    """More than memory.limit can ever hold is the server's configuration, not a passing rush."""
    port = free_port()
    start_corrald(
        "http:\n"
        f'  listen: ["127.0.0.1:{port}"]\n'
        f"memory: {{limit: 16MiB, swap_dir: \"{tmp_path}/swap\"}}\n"
        "models:\n"
        f"  - {{name: small, path: {shared_path('models/stories260K.gguf')}, pin: true}}\n"
        f"  - {{name: big, path: {shared_path('models/synth-llama-f32.gguf')}}}\n"
    )
    resp, payload = request(port, "POST", "/v1/completions",
                            {"model": "big", "prompt": "x", "max_tokens": 2})
    assert resp.status == 500, payload
    err = error_of(payload)
    assert (err["type"], err["code"]) == ("server_error", "insufficient_memory"), err
    assert "can never fit" in err["message"], err
    resp, payload = request(port, "POST", "/api/generate",
                            {"model": "big", "prompt": "x", "stream": False})
    assert resp.status == 500, payload
    assert "can never fit" in json.loads(payload)["error"]


def test_sanitizer_profiles_apply_over_http(start_corrald):
    """The model's profile, or the one corral.sanitizer names, runs on an HTTP request as on a
    ZeroMQ one: a rejection is 400 sanitizer_rejected naming the step, a pass reports each step
    in usage.corral.sanitizer_report, and an unknown profile is refused by name."""
    port = free_port()
    stories = shared_path("models/stories260K.gguf")
    start_corrald(
        "http:\n"
        f'  listen: ["127.0.0.1:{port}"]\n'
        "sanitizers:\n"
        "  - name: strict\n"
        "    steps:\n"
        '      - deny: {secret: "/password/i"}\n'
        "      - max_input: {bytes: 200}\n"
        "models:\n"
        f"  - {{name: guarded, path: {stories}, context: 512, sanitizer: strict}}\n"
        f"  - {{name: plain, path: {stories}, context: 512}}\n"
    )
    secret = "Once my Password was"

    def completion(model: str, prompt: str, **corral):
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        if corral:
            body["corral"] = corral
        return request(port, "POST", "/v1/completions", body)

    for model, extras in [("guarded", {}), ("plain", {"sanitizer": "strict"})]:
        resp, payload = completion(model, secret, **extras)
        assert resp.status == 400, (model, payload)
        err = error_of(payload)
        assert (err["type"], err["code"]) == ("invalid_request_error", "sanitizer_rejected"), err
        assert "deny" in err["message"] and "secret" in err["message"], err
    resp, payload = completion("plain", secret)
    assert resp.status == 200, payload
    assert json.loads(payload)["usage"]["corral"]["sanitizer_report"] is None
    resp, payload = completion("plain", PROMPT, sanitizer="strict")
    assert resp.status == 200, payload
    report = json.loads(payload)["usage"]["corral"]["sanitizer_report"]
    assert report == "deny=passed max_input=passed", report
    resp, payload = completion("plain", PROMPT, sanitizer="nosuch")
    assert resp.status == 400, payload  # not 404 model_not_found: the model is there
    err = error_of(payload)
    assert (err["param"], err["code"]) == ("corral.sanitizer", "invalid_value"), err
    assert "sanitizer profile 'nosuch' is not configured" in err["message"], err
    resp, payload = request(port, "POST", "/api/generate",
                            {"model": "guarded", "prompt": secret, "stream": False})
    assert resp.status == 400, payload
    assert "deny" in json.loads(payload)["error"]


def test_cors_preflight_and_origin(api):
    _, port = api
    resp, _ = request(port, "OPTIONS", "/v1/chat/completions",
                      headers={"Origin": "http://app.example",
                               "Access-Control-Request-Method": "POST"})
    assert resp.status == 204
    assert resp.getheader("Access-Control-Allow-Origin") == "http://app.example"
    assert "Authorization" in resp.getheader("Access-Control-Allow-Headers")
    resp, _ = request(port, "OPTIONS", "/v1/chat/completions",
                      headers={"Origin": "http://evil.example"})
    assert resp.status == 403
    assert resp.getheader("Access-Control-Allow-Origin") is None
    resp, _ = request(port, "GET", "/v1/models", headers={"Origin": "http://app.example"})
    assert resp.getheader("Access-Control-Allow-Origin") == "http://app.example"


def test_bearer_keys_map_to_apps(start_corrald, tmp_path):
    """A key's requests run as its app, whose rules the core enforces (here: only the model
    `stories-q4`); a wrong key is 401; a loopback client without a key is the default app."""
    key = "k3y-for-the-speaker-app-0123456789"
    (tmp_path / "speaker.key").write_text(key + "\n")
    port = free_port()
    start_corrald(http_config(
        port, f"  keys: [{{key_file: {tmp_path / 'speaker.key'}, app: speaker}}]\n",
        "apps:\n  - name: speaker\n    models: [stories-q4]\n"))
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 2}
    resp, payload = request(port, "POST", "/v1/completions", body,
                            {"Authorization": f"Bearer {key}"})
    assert resp.status == 403
    err = error_of(payload)
    assert err["type"] == "permission_error" and "speaker" in err["message"]
    resp, _ = request(port, "POST", "/v1/completions", {**body, "model": "stories-q4"},
                      {"Authorization": f"Bearer {key}"})
    assert resp.status == 200
    resp, payload = request(port, "POST", "/v1/completions", body,
                            {"Authorization": "Bearer not-the-key-at-all-000000"})
    assert resp.status == 401
    assert error_of(payload)["message"] == "incorrect API key"
    resp, _ = request(port, "POST", "/v1/completions", body, {"Authorization": "Basic eA=="})
    assert resp.status == 401
    resp, _ = request(port, "POST", "/v1/completions", body)
    assert resp.status == 200
    # Sessions are their app's: the default app's session is refused to the key's app.
    resp, _ = request(port, "POST", "/v1/completions", {**body, "corral": {"session": "tale"}})
    assert resp.status == 200
    resp, payload = request(port, "POST", "/v1/completions",
                            {**body, "model": "stories-q4", "corral": {"session": "tale"}},
                            {"Authorization": f"Bearer {key}"})
    assert resp.status == 403
    assert "session 'tale' belongs to another app" in error_of(payload)["message"]


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine other than loopback, or None when it has none (asked of
    each interface with SIOCGIFADDR: no tool such as `ip` needs to be installed)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                info = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            address = socket.inet_ntoa(info[20:24])
            if not address.startswith("127."):
                return address
    return None


def test_a_client_beyond_loopback_needs_a_key(start_corrald, tmp_path):
    """Served on an address beyond loopback (allowed only with keys), a request without a key is
    401 even for the default app that loopback clients get; with its key it runs."""
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no IPv4 address beyond loopback")
    key = "k3y-for-the-remote-app-0123456789"
    (tmp_path / "remote.key").write_text(key + "\n")
    port = free_port()
    start_corrald(
        f'http:\n  listen: ["{address}:{port}"]\n'
        f"  keys: [{{key_file: {tmp_path / 'remote.key'}, app: remote}}]\n"
        + stories_config() + "apps:\n  - name: remote\n    models: [stories]\n")
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 2}

    def post(headers: dict) -> tuple[int, bytes]:
        r, payload = request(port, "POST", "/v1/completions", body, headers, host=address)
        return r.status, payload

    status, payload = post({})
    assert status == 401, payload
    assert "an API key is required from beyond this machine" in error_of(payload)["message"]
    status, payload = post({"Authorization": "Bearer not-the-key-at-all-000000"})
    assert status == 401, payload
    status, payload = post({"Authorization": f"Bearer {key}"})
    assert status == 200, payload


@pytest.fixture
def apps_api(start_corrald, tmp_path):
    """A corrald whose HTTP keys map to apps with rules beyond `models`: capped (max_priority
    interactive), plain (no admin), ops (admin, max_priority realtime), ratey (2 requests a
    minute). Yields (daemon, port, {app: headers with its key})."""
    headers, entries = {}, []
    for app in ("capped", "plain", "ops", "ratey"):
        key = f"key-of-the-{app}-app-0123456789"
        (tmp_path / f"{app}.key").write_text(key + "\n")
        entries.append(f"{{key_file: {tmp_path / (app + '.key')}, app: {app}}}")
        headers[app] = {"Authorization": f"Bearer {key}"}
    port = free_port()
    daemon = start_corrald(http_config(
        port, f"  keys: [{', '.join(entries)}]\n",
        "apps:\n"
        "  - name: capped\n    max_priority: interactive\n"
        "  - name: plain\n"
        "  - name: ops\n    admin: true\n    max_priority: realtime\n"
        "  - name: ratey\n    requests_per_minute: 2\n"))
    return daemon, port, headers


def wait_for_log(daemon, text: str, count: int = 1) -> None:
    """Wait (up to 25 s) until the daemon's log holds `text` at least `count` times."""
    deadline = time.monotonic() + 25
    while daemon.log().count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in:\n{daemon.log()}"
        time.sleep(0.02)


def test_priority_above_the_apps_ceiling_is_403(apps_api):
    """corral.priority above the key's app's max_priority is refused with an OpenAI error naming
    the ceiling (and logged with the rule); within it, or for an app whose ceiling is realtime,
    the same request is served."""
    daemon, port, key = apps_api
    body = chat_body(max_tokens=2, corral={"priority": "realtime"})
    resp, payload = request(port, "POST", "/v1/chat/completions", body, key["capped"])
    assert resp.status == 403, payload
    err = error_of(payload)
    assert err["type"] == "permission_error" and err["code"] == "permission_denied"
    assert err["message"] == ("app 'capped' may not ask for priority realtime: its ceiling is "
                              "interactive (apps[].max_priority)")
    wait_for_log(daemon, 'msg="permission denied" app=capped rule=max_priority model=stories')
    resp, payload = request(port, "POST", "/v1/chat/completions",
                            chat_body(max_tokens=2, corral={"priority": "interactive"}),
                            key["capped"])
    assert resp.status == 200, payload
    resp, payload = request(port, "POST", "/v1/chat/completions", body, key["ops"])
    assert resp.status == 200, payload


def test_ollama_load_and_unload_need_admin(apps_api):
    """Ollama's /api/generate without a prompt loads the model (keep_alive -1: and pins it) or,
    with keep_alive 0, unloads it: admin operations, refused (403, Ollama's error shape, logged
    with the rule) to an app without `admin`, done for one with it."""
    from corral import Client

    daemon, port, key = apps_api
    denied = 'msg="permission denied" app=plain rule=admin model=stories'
    for keep_alive, verb in [(-1, "load"), ("-1m", "load"), (0, "unload")]:
        resp, payload = request(port, "POST", "/api/generate",
                                {"model": "stories", "keep_alive": keep_alive}, key["plain"])
        assert resp.status == 403, (keep_alive, payload)
        assert json.loads(payload) == {
            "error": f"app 'plain' may not {verb} models: admin operations need apps[].admin"}
    # One log line for each refusal.
    wait_for_log(daemon, denied, 3)
    with Client(daemon.endpoint, timeout=30) as c:
        assert c.status("stories").model("stories").state.value == "unloaded"
        resp, payload = request(port, "POST", "/api/generate",
                                {"model": "stories", "keep_alive": -1}, key["ops"])
        assert resp.status == 200, payload
        assert json.loads(payload)["done_reason"] == "load"
        m = c.status("stories").model("stories")
        assert m.state.value == "resident" and m.pinned
        resp, payload = request(port, "POST", "/api/generate",
                                {"model": "stories", "keep_alive": 0}, key["ops"])
        assert resp.status == 200, payload
        assert c.status("stories").model("stories").state.value == "unloaded"
    assert daemon.log().count(denied) == 3


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_ollama_keep_alive_beyond_an_apps_rights_is_left_unapplied(apps_api, path):
    """Ollama clients send keep_alive with their requests: for an app without `admin`, an answer
    with a prompt is served (not refused for it), the pin it asks for is not made, and the log
    says so with the rule."""
    from corral import Client

    daemon, port, key = apps_api
    body = {"model": "stories", "stream": False, "keep_alive": -1, "options": {"num_predict": 2}}
    body.update({"prompt": PROMPT} if path == "/api/generate"
                else {"messages": [{"role": "user", "content": PROMPT}]})
    resp, payload = request(port, "POST", path, body, key["plain"])
    assert resp.status == 200, payload
    wait_for_log(daemon, 'msg="keep_alive not applied"')
    wait_for_log(daemon, 'msg="permission denied" app=plain rule=admin model=stories')
    with Client(daemon.endpoint, timeout=30) as c:
        assert not c.status("stories").model("stories").pinned


def test_requests_per_minute_refuses_the_third(apps_api):
    """An app allowed 2 requests a minute has its third, sent right behind, refused with an
    OpenAI error naming the rate: 429 rate_limit_error (which clients retry after a while, where
    the other rules' 403 tells them not to), logged with the rule; another app is not held to that
    rate."""
    daemon, port, key = apps_api
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 2}
    for _ in range(2):
        resp, payload = request(port, "POST", "/v1/completions", body, key["ratey"])
        assert resp.status == 200, payload
    resp, payload = request(port, "POST", "/v1/completions", body, key["ratey"])
    assert resp.status == 429, payload
    err = error_of(payload)
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
    assert err["message"] == ("app 'ratey' is over its rate of 2 requests per minute "
                              "(apps[].requests_per_minute)")
    wait_for_log(daemon, 'msg="permission denied" app=ratey rule=requests_per_minute')
    resp, payload = request(port, "POST", "/v1/completions", body, key["plain"])
    assert resp.status == 200, payload


def json_schema_format(name: str) -> tuple[dict, dict]:
    """tests/schemas/NAME.json, and the response_format that asks for it."""
    from test_json_schema import SCHEMA_DIR, load

    schema = load(os.path.join(SCHEMA_DIR, f"{name}.json"))
    return schema, {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                          "strict": True}}


@pytest.mark.parametrize("name", ["event", "weather"])
def test_chat_json_schema_output_validates(api, name):
    """response_format json_schema on /v1/chat/completions: the content of an answer that ended
    by itself ("stop") parses and validates with jsonschema (formats included: event has uuid
    and date-time, weather an enum, a date and an array of objects)."""
    from test_json_schema import validator

    _, port = api
    schema, response_format = json_schema_format(name)
    resp, payload = request(port, "POST", "/v1/chat/completions",
                            chat_body(max_tokens=1000, response_format=response_format))
    assert resp.status == 200, payload
    choice = json.loads(payload)["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    validator(schema).validate(json.loads(choice["message"]["content"]))


def test_chat_json_schema_cut_by_max_tokens_says_length(api):
    """An answer under a schema that max_tokens cuts short says finish_reason "length" after
    exactly max_tokens tokens; its content is the start of a document the schema allows (an
    object), not the story the model writes without it."""
    _, port = api
    _, response_format = json_schema_format("person")
    resp, payload = request(port, "POST", "/v1/chat/completions",
                            chat_body(max_tokens=6, response_format=response_format))
    assert resp.status == 200, payload
    doc = json.loads(payload)
    assert doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] == 6
    assert doc["choices"][0]["message"]["content"].lstrip().startswith("{")


def test_ipv6_loopback_address(start_corrald):
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    start_corrald(f'http: {{listen: ["[::1]:{port}"]}}\n' + stories_config())
    conn = http.client.HTTPConnection("::1", port, timeout=30)
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["data"][0]["id"] == "stories"
    conn.close()


def check_config(tmp_path, body: str) -> subprocess.CompletedProcess:
    path = tmp_path / "check.yaml"
    path.write_text(f'listen: ["ipc://{tmp_path}/s/c.sock"]\n' + body)
    return subprocess.run([corrald_path(), "-c", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=30, check=False)


def test_config_refuses_non_loopback_without_keys(tmp_path):
    r = check_config(tmp_path, 'http: {listen: ["0.0.0.0:11435"]}\n')
    assert r.returncode == 1
    assert "'0.0.0.0:11435' is not a loopback address" in r.stderr
    assert "http.keys" in r.stderr
    r = check_config(tmp_path, 'http: {listen: ["127.0.0.1:99999"]}\n')
    assert r.returncode == 1 and "bad port" in r.stderr
    r = check_config(tmp_path, 'http: {listen: ["example.com:80"]}\n')
    assert r.returncode == 1 and "not an IPv4 address" in r.stderr


def test_check_config_binds_the_http_address(tmp_path):
    port = free_port()
    r = check_config(tmp_path, f'http: {{listen: ["127.0.0.1:{port}"]}}\n')
    assert r.returncode == 0, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        r = check_config(tmp_path, f'http: {{listen: ["127.0.0.1:{port}"]}}\n')
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
    key = tmp_path / "short.key"
    key.write_text("short\n")
    r = check_config(tmp_path, f'http: {{listen: ["127.0.0.1:{port}"], '
                               f'keys: [{{key_file: {key}, app: a}}]}}\n')
    assert r.returncode == 1 and "short.key" in r.stderr


def test_shipped_config_serves_http_on_loopback():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "config", "corral.yaml"), encoding="utf-8") as f:
        text = f.read()
    assert 'listen: ["127.0.0.1:11435"]' in text
    assert shared_path("models/stories260K.gguf")
