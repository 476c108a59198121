"""A user's first hour (issue 20, part B; part A's checks are test_first_hour.py), against a real
corrald, as a user meets it.

One test (or a few) per finding of the issue that part B fixes, each failing before its fix:

- finding 2, feedback on long work: Progress messages with a phase (loading, merging,
  repacking, prefill) for loads, pins and generations; the progress line of `corral load`,
  `run`, `synth`, `merge` and `bench` on a terminal, and nothing when stderr is not one;
- finding 3, checks that catch mistakes: `corrald --check-config` and startup report every
  problem (model headers, templates, contexts) with file:line:col and did-you-mean; failed
  requests are logged at warn;
- finding 4, fail fast: no daemon is reported within about a second; a request that can never
  fit memory.limit fails at once naming both sizes;
- finding 5, chats that go on: the oldest turns are dropped when a chat outgrows the context;
- finding 6, the chat REPL: a banner, /help, /clear, /system, /stats, a marker on cut replies, a
  newline on Ctrl-D, and an unknown model refused at start;
- finding 7, residency: pin loads and keeps, unload refuses a pin (or --force unpins);
- `corral add`, `rm` and `show`: the configuration edited with its comments kept, and reloaded.

Nothing here depends on timing: waits are bounded by the daemon's answers, and the only clocks
are generous upper bounds far above what the fixed behaviour needs and far below what the old
behaviour took (its 30 s timeouts).
"""

from __future__ import annotations

import asyncio
import math
import os
import pty
import re
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest

from conftest import corrald_path, shared_path
from corral import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ProgressPhase,
    ResourceExhausted,
    Unavailable,
)
from test_cli_bench import corral_path

STORIES = shared_path("models/stories260K.gguf")
LORA = shared_path("lora/stories260K-lora-r8.gguf")
SYNTH = shared_path("models/synth-llama-q8_0.gguf")  # rearranged for the kernels on first load


def models_body(*extra: str) -> str:
    """A config serving `stories`, the LoRA variant `tale` and `synth` (whose first load writes
    its rearranged weights), plus the lines given."""
    return (
        "models:\n"
        f"  - {{name: stories, path: {STORIES}, context: 512}}\n"
        f"  - name: tale\n    path: {STORIES}\n"
        f"    adapters: [{{path: {LORA}, scale: 1.0}}]\n"
        f"  - {{name: synth, path: {SYNTH}}}\n" + "".join(extra)
    )


def phases(reports) -> list[tuple[str, int, int]]:
    return [(p.phase.value, p.done, p.total) for p in reports]


def cli(
    *args: str, endpoint: Optional[str] = None, stdin: Optional[bytes] = None, env=None
) -> subprocess.CompletedProcess:
    extra = ["--endpoint", endpoint] if endpoint else []
    return subprocess.run(
        [corral_path(), *args[:1], *extra, *args[1:]],
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
        env=env,
    )


def on_terminal(
    argv: Sequence[str], *, stdin: Optional[bytes] = None, tty_stdin: bool = False,
    env=None, timeout: float = 120,
) -> tuple[int, bytes]:
    """Run argv with stdout and stderr on a pseudo-terminal (and stdin too when tty_stdin, fed
    `stdin` through it); returns the exit status and everything the terminal received."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        list(argv),
        stdin=slave if tty_stdin else subprocess.PIPE,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    if tty_stdin:
        if stdin:
            os.write(master, stdin)
    else:
        assert proc.stdin is not None
        proc.stdin.write(stdin or b"")
        proc.stdin.close()
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            out += data
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), out


def without_progress(stderr: bytes) -> None:
    """What a pipe gets: no progress line (no carriage return, no erase-line sequence)."""
    assert b"\r" not in stderr and b"\x1b[K" not in stderr, stderr


# --- finding 2: progress -------------------------------------------------------------------------


def test_load_reports_its_phases_to_the_client(start_corrald):
    d = start_corrald(models_body())
    with Client(d.endpoint, timeout=60) as c:
        seen = []
        c.load("tale", progress=seen.append)
        got = phases(seen)
        # In order: the load began, then the merge of the variant's adapters, to its end.
        assert got[0] == ("loading", 0, 0), got
        merging = [p for p in got if p[0] == "merging"]
        assert merging and merging[-1][1] == merging[-1][2] > 0, got
        assert [p[0] for p in got] == sorted((p[0] for p in got), key=lambda n: [
            "loading", "merging", "repacking"].index(n)), got
        assert all(p.model == "tale" for p in seen)
        # The first load of synth rearranges its weights: repacking, to its end.
        seen = []
        c.load("synth", progress=seen.append)
        repacking = [p for p in phases(seen) if p[0] == "repacking"]
        assert repacking and repacking[-1][1] == repacking[-1][2] > 0, phases(seen)
        assert seen[-1].fraction == 1.0
        # Once cached, a load merges and rearranges nothing: it only says it loads — also when
        # it ends before the front end looks (its report and its answer then come together).
        for _ in range(10):
            c.unload("tale")
            seen = []
            c.load("tale", progress=seen.append)
            assert phases(seen) == [("loading", 0, 0)]
        # A client that did not ask gets no Progress (the reply alone).
        c.unload("tale")
        assert "resident" in c.load("tale")


def test_a_quantized_variant_reports_its_quantizing(start_corrald, tmp_path: Path):
    # A `quantize:` entry is made once on its first load: that wait shows as its own phase,
    # between loading and the rearranging of the quantized weights.
    d = start_corrald(
        f"cache: {{dir: {tmp_path}/cache}}\n"
        "models:\n"
        f"  - {{name: q, path: {shared_path('models/synth-llama-f32.gguf')}, quantize: q8_0}}\n"
        f"  - name: tale-q\n    path: {STORIES}\n    quantize: q8_0\n"
        f"    adapters: [{{path: {LORA}}}]\n"
    )
    with Client(d.endpoint, timeout=60) as c:
        for name in ("q", "tale-q"):
            seen = []
            c.load(name, progress=seen.append)
            got = phases(seen)
            assert got[0] == ("loading", 0, 0), got
            quantizing = [p for p in got if p[0] == "quantizing"]
            assert quantizing and quantizing[-1][1] == quantizing[-1][2] > 0, got
            assert "merging" not in [p[0] for p in got], got  # merged as it is quantized
            order = ["loading", "quantizing", "repacking"]
            assert [p[0] for p in got] == sorted((p[0] for p in got), key=order.index), got
    # corral merge --type draws the same on a terminal.
    out_path = tmp_path / "tale-q8.gguf"
    rc, out = on_terminal([corral_path(), "merge", STORIES, "--lora", LORA, "--type", "q8_0",
                           "-o", str(out_path)])
    assert rc == 0, out
    assert re.search(rb"tale-q8\.gguf: merging and quantizing \[#+\] 100%", out), out


def test_pin_and_generation_report_progress(start_corrald):
    d = start_corrald(models_body())
    with Client(d.endpoint, timeout=60) as c:
        seen = []
        c.pin("synth", progress=seen.append)
        assert [p[0] for p in phases(seen)][:1] == ["loading"]
        c.unpin("synth")
        c.unload("synth")
        # A generation waiting for its model hears the load, then its long prompt's prefill.
        s = c.generate("synth", "hello " * 100, max_tokens=2, temperature=0, stream=True)
        seen = []
        s.on_progress = seen.append
        list(s)
        got = phases(seen)
        assert got[0] == ("loading", 0, 0), got
        prefill = [p for p in seen if p.phase is ProgressPhase.PREFILL]
        assert prefill and prefill[-1].done == prefill[-1].total == s.done.prompt_tokens, got
        # The fields of clients from before phases still carry prefill.
        assert prefill[-1].prefilled_tokens == prefill[-1].done


def test_cli_load_and_run_draw_a_progress_line_on_a_terminal_only(start_corrald):
    d = start_corrald(models_body())
    rc, out = on_terminal([corral_path(), "load", "--endpoint", d.endpoint, "synth"])
    assert rc == 0, out
    assert b"\rsynth: loading..." in out and b"synth: repacking [" in out, out
    assert b"100%" in out and out.endswith(b"loaded synth\r\n"), out
    # The same on a pipe: only the result.
    r = cli("unload", "synth", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    r = cli("load", "synth", endpoint=d.endpoint)
    assert r.returncode == 0 and r.stdout == b"loaded synth\n", r
    without_progress(r.stderr)
    # run: the prefill of a long prompt, erased before the text.
    rc, out = on_terminal([corral_path(), "run", "--endpoint", d.endpoint, "synth",
                           "hello " * 100, "-n", "2", "--temp", "0"])
    assert rc == 0, out
    assert b"synth: prefill [" in out and b"\r\x1b[K" in out, out
    r = cli("run", "synth", "hello " * 100, "-n", "2", "--temp", "0", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    without_progress(r.stderr)


def test_synth_merge_and_bench_show_progress_on_a_terminal(tmp_path: Path):
    out_model = tmp_path / "m.gguf"
    args = [corral_path(), "synth", "--type", "q8_0", "--n-embd", "256", "--n-layer", "2",
            "--n-head", "4", "--n-head-kv", "2", "--n-ff", "768", "--n-vocab", "512",
            "--n-ctx", "512", "-o", str(out_model)]
    rc, out = on_terminal(args)
    assert rc == 0, out
    assert re.search(rb"m\.gguf: writing \[#+\] 100%", out), out
    r = subprocess.run(args, capture_output=True, timeout=120)
    assert r.returncode == 0
    without_progress(r.stderr)

    merged = tmp_path / "merged.gguf"
    margs = [corral_path(), "merge", STORIES, "--lora", LORA, "-o", str(merged)]
    rc, out = on_terminal(margs)
    assert rc == 0, out
    assert re.search(rb"merged\.gguf: merging \[#+\] 100%", out), out
    r = subprocess.run(margs, capture_output=True, timeout=120)
    assert r.returncode == 0
    without_progress(r.stderr)

    bargs = [corral_path(), "bench", str(out_model), "-p", "16", "-n", "4", "-r", "2",
             "--cache-dir", str(tmp_path / "cache")]
    rc, out = on_terminal(bargs)
    assert rc == 0, out
    assert b"repacking [" in out and b"prompt runs [" in out and b"generation runs [" in out, out
    r = subprocess.run(bargs, capture_output=True, timeout=120)
    assert r.returncode == 0
    without_progress(r.stderr)


# --- finding 3: checks ---------------------------------------------------------------------------


def test_check_config_reports_every_problem(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text("# not a model\n")
    config = tmp_path / "corral.yaml"
    config.write_text(
        "limits:\n"
        "  max_mesage_bytes: 1MiB\n"
        "models:\n"
        f"  - name: a\n    path: {STORIES}\n    template: bogus\n    context: 99999\n"
        f"  - name: b\n    path: {readme}\n"
        f"  - name: c\n    path: {shared_path('models/legacy-v1.gguf')}\n"
    )
    for extra in (["--check-config"], []):
        r = subprocess.run([corrald_path(), "-c", str(config), *extra], capture_output=True,
                           timeout=60, text=True)
        assert r.returncode == 1, r
        err = r.stderr
        assert f"{config}:2:3: unknown key 'limits.max_mesage_bytes' (did you mean " \
               "'limits.max_message_bytes'?)" in err, err
        assert f"{config}:6:15: model 'a': unknown chat template 'bogus'" in err, err
        assert f"{config}:7:14: model 'a': context 99999 is more than the 2048 positions" in err
        assert f"{config}:9:11: model 'b': {readme}: header: not a GGUF file" in err, err
        assert f"{config}:11:11: model 'c':" in err and "GGUF version 1" in err, err
        assert "5 problems" in err, err


def test_a_corrupt_adapter_is_reported_before_the_first_request(tmp_path: Path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    config = tmp_path / "corral.yaml"
    config.write_text(f"models:\n  - name: tale\n    path: {STORIES}\n"
                      f"    adapters: [{{path: {bad}}}]\n")
    for extra in (["--check-config"], []):
        r = subprocess.run([corrald_path(), "-c", str(config), *extra], capture_output=True,
                           timeout=60, text=True)
        assert r.returncode == 1, r
        assert f"{config}:2:5: model 'tale': adapter {bad} does not fit {STORIES}" in r.stderr, \
            r.stderr


def test_template_names_get_a_suggestion(tmp_path: Path):
    config = tmp_path / "corral.yaml"
    config.write_text(f"models:\n  - name: a\n    path: {STORIES}\n    template: mistral\n")
    r = subprocess.run([corrald_path(), "-c", str(config), "--check-config"],
                       capture_output=True, timeout=60, text=True)
    assert r.returncode == 1
    assert "unknown chat template 'mistral' (did you mean 'mistral-v1'?)" in r.stderr, r.stderr


def test_failed_requests_are_logged_at_warn(start_corrald):
    d = start_corrald(models_body())
    with Client(d.endpoint, timeout=30) as c:
        with pytest.raises(NotFound):
            c.generate("nope", "x")
        with pytest.raises(InvalidArgument):
            c.generate("stories", "x", max_tokens=100000)
    log = d.log()
    assert re.search(r'level=warn msg="request failed" id=\d+ app=\S+ kind=generate model=nope '
                     r'code=NOT_FOUND reason="model \'nope\' is not configured; configured: '
                     r'stories, tale, synth"', log), log
    assert re.search(r'level=warn msg="request failed" .*model=stories code=INVALID_ARGUMENT '
                     r'reason="max_tokens 100000 exceeds', log), log


def test_a_reload_with_a_broken_model_is_refused(start_corrald):
    d = start_corrald(models_body())
    text = Path(d.config_path).read_text()
    Path(d.config_path).write_text(text + f"  - {{name: x, path: {STORIES}, template: bogus}}\n")
    d.process.send_signal(1)  # SIGHUP
    deadline = time.monotonic() + 20
    while "config reload failed" not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "unknown chat template 'bogus'" in d.log()
    with Client(d.endpoint, timeout=30) as c:
        assert "x" not in {m.name for m in c.list_models()}


# --- finding 4: fail fast ------------------------------------------------------------------------


def test_clients_report_a_missing_daemon_at_once(tmp_path: Path):
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    start = time.monotonic()
    with Client(endpoint, timeout=60) as c:
        with pytest.raises(Unavailable, match=r"no answer from corrald at .*is it running\?"):
            c.generate("stories", "x")
    # Before the fix: 60 s (the timeout). The client allows CONNECT_TIMEOUT_S, 1 s.
    assert time.monotonic() - start < 20

    async def main():
        async with AsyncClient(endpoint, timeout=60) as ac:
            with pytest.raises(Unavailable, match="is it running"):
                await ac.status()

    start = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - start < 20


def pending_endpoint() -> tuple[str, list]:
    """A tcp endpoint whose connections stay pending: a listener whose backlog is full (the kernel
    then drops new connections' SYNs), as a daemon too busy to be reached at once looks. Returns
    the endpoint and the sockets to keep open."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    held = [listener]
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(listener.getsockname())
        except BlockingIOError:
            pass
        held.append(s)
    return f"tcp://127.0.0.1:{listener.getsockname()[1]}", held


def test_a_connection_not_made_yet_is_not_called_a_missing_daemon():
    # Fail fast only on evidence (an attempt refused, as above): a connection still pending — a
    # daemon on a machine too busy to take it at once — waits for the call's own timeout instead of
    # being told "is it running?" after a second.
    endpoint, held = pending_endpoint()
    try:
        with Client(endpoint, timeout=3) as c:
            with pytest.raises(DeadlineExceeded, match="within 3 s"):
                c.ping()

        async def main():
            async with AsyncClient(endpoint, timeout=3) as ac:
                with pytest.raises(DeadlineExceeded, match="within 3 s"):
                    await ac.ping()

        asyncio.run(main())
    finally:
        for s in held:
            s.close()


def test_a_request_that_can_never_fit_fails_at_once(start_corrald, tmp_path: Path):
    # A pinned model holds 1.1 MiB of a 16 MiB budget; synth-llama-f32 needs 15.1 MiB to load.
    d = start_corrald(
        f"memory: {{limit: 16MiB, swap_dir: \"{tmp_path}/swap\"}}\n"
        "limits: {memory_wait_ms: 600000}\n"
        "models:\n"
        f"  - {{name: small, path: {STORIES}, pin: true}}\n"
        f"  - {{name: big, path: {shared_path('models/synth-llama-f32.gguf')}}}\n"
    )
    with Client(d.endpoint, timeout=60) as c:
        assert c.status("small").models[0].state.value == "resident"  # pin: true loads it
        start = time.monotonic()
        with pytest.raises(ResourceExhausted) as info:
            c.generate("big", "x", max_tokens=2)
        # It waited for nothing before: memory_wait_ms (600 s; the watchdog ends it at 30).
        assert time.monotonic() - start < 20
    msg = str(info.value)
    assert "MiB are needed but memory.limit is 16.0 MiB" in msg and "can never fit" in msg, msg
    assert "'small'" in msg and "(pinned)" in msg, msg


# --- finding 5: chats that go on -----------------------------------------------------------------


def test_a_long_chat_drops_its_oldest_turns(start_corrald):
    d = start_corrald(
        "models:\n"
        f"  - {{name: stories, path: {STORIES}, context: 256}}\n"
        f"  - {{name: strict, path: {STORIES}, context: 256, context_overflow: error}}\n"
    )
    turn = "Once upon a time there was a little girl named Lily who liked to play in the park."
    with Client(d.endpoint, timeout=60) as c:
        assert {m.name: m.context_overflow for m in c.list_models()} == {
            "stories": "truncate_oldest", "strict": "error"}
        msgs = [{"role": "system", "content": "You tell stories."}]
        dropped = []
        for _ in range(8):
            msgs.append({"role": "user", "content": turn})
            r = c.chat("stories", msgs, max_tokens=40, temperature=0, session="s",
                       return_done=True)
            msgs.append({"role": "assistant", "content": r.text})
            dropped.append(r.done.dropped_messages)
            # The prompt always leaves room for an answer (a quarter of the context here).
            assert r.done.prompt_tokens + 40 <= 256, r.done
        # Before the fix the turns past the context failed; now the oldest go, in pairs.
        assert dropped[0] == 0 and dropped[-1] > 0, dropped
        assert all(n % 2 == 0 for n in dropped), dropped
        # The system message stays: the session's cache still holds it, so it is not recomputed.
        assert r.done.prefilled_tokens < r.done.prompt_tokens, r.done
        with pytest.raises(InvalidArgument,
                           match=r"the prompt has \d+ tokens; the context of model 'strict' "
                                 r"holds 256 \(its context_overflow is error"):
            c.chat("strict", msgs, max_tokens=40)


def test_a_chat_of_many_turns_is_fitted_in_few_tokenizations(start_corrald):
    """Fitting a long chat drops the fewest oldest turns, found by doubling and halving: the chat
    is rendered and tokenized O(log turns) times (the debug line's `renders`), not once per turn
    dropped, which a chat of many tiny turns made quadratic on the preparer every request goes
    through. The start found is the first that fits: one turn more does not."""
    d = start_corrald(
        "log_level: debug\n"
        f"models:\n  - {{name: stories, path: {STORIES}, context: 256, template: chatml}}\n"
    )
    msgs = []
    for i in range(2000):
        msgs.append({"role": "user", "content": "the cat " * (1 + i % 5)})
        msgs.append({"role": "assistant", "content": "a dog" + " ran" * (i % 3)})
    msgs.append({"role": "user", "content": "Once upon a time"})
    with Client(d.endpoint, timeout=60) as c:
        r = c.chat("stories", msgs, max_tokens=16, temperature=0, return_done=True)
        dropped = r.done.dropped_messages
        assert 0 < dropped < len(msgs) - 1 and dropped % 2 == 0, r.done
        assert r.done.prompt_tokens + 16 <= 256, r.done
        line = next(l for l in d.log().splitlines() if "chat truncated to fit" in l)
        renders = int(re.search(r"renders=(\d+)", line).group(1))
        # The bytes check leaves out what can never fit without tokenizing it; of the turns
        # left, about 2 log2 are tried (one at a time: as many as were dropped after it).
        assert renders <= 2 * math.ceil(math.log2(len(msgs))) + 2, line
        # The first start that fits: what it kept fits as it is; one turn more does not.
        kept = msgs[dropped:]
        again = c.chat("stories", kept, max_tokens=16, temperature=0, return_done=True)
        assert again.done.dropped_messages == 0 and again.text == r.text, again.done
        more = c.chat("stories", msgs[dropped - 2:], max_tokens=16, temperature=0,
                      return_done=True)
        assert more.done.dropped_messages == 2, more.done


# --- finding 6: the chat REPL --------------------------------------------------------------------


def test_chat_refuses_an_unknown_model_at_start(stories):
    r = cli("chat", "storise", endpoint=stories.endpoint, stdin=b"never read\n")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "model 'storise' is not configured (corrald serves: stories, stories-q4)" in err, err
    assert "did you mean 'stories'?" in err, err
    assert r.stdout == b""


def test_chat_commands_are_not_sent_to_the_model(stories):
    script = (b"/help\n/system You are terse.\n/system\n/stats\nOnce upon a time\n/stats\n"
              b"/clear\n/stats\n/bogus\n/exit\n")
    r = cli("chat", "stories", "-n", "4", "--temp", "0", endpoint=stories.endpoint, stdin=script)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    for want in ("/help", "/clear", "/system [TEXT]", "/stats", "/exit"):
        assert want in err, err
    assert "(system message set)" in err and "system: You are terse." in err, err
    assert "conversation: 1 messages (0 of yours), with a system message" in err, err
    assert "conversation: 3 messages (1 of yours), with a system message" in err, err
    assert "(conversation cleared; the system message stays)" in err, err
    assert "unknown command /bogus" in err, err
    # One reply (4 tokens, cut: noted on stderr; stdout, a pipe, holds the text alone).
    assert "(the reply was cut at 4 tokens" in err, err
    assert r.stdout.count(b"\n") == 1 and b"[...]" not in r.stdout, r.stdout


def test_chat_on_a_terminal_has_a_banner_a_marker_and_ends_its_line(stories):
    rc, out = on_terminal(
        [corral_path(), "chat", "--endpoint", stories.endpoint, "stories", "-n", "4",
         "--temp", "0"],
        stdin=b"Once upon a time\n\x04", tty_stdin=True)
    assert rc == 0, out
    assert b"corral chat with stories (" in out and b"/help lists the commands" in out, out
    assert b" [...]\r\n" in out, out  # the cut reply's marker
    assert out.endswith(b"> \r\n"), out  # Ctrl-D ends the prompt's line


# --- finding 7: residency ------------------------------------------------------------------------


def test_pin_loads_and_unload_respects_it(stories):
    with Client(stories.endpoint, timeout=30) as c:
        assert c.status("stories").models[0].state.value == "unloaded"
        assert c.pin("stories") == "model 'stories' is resident and pinned"
        m = c.status("stories").models[0]
        assert m.state.value == "resident" and m.pinned and m.bytes > 0
        with pytest.raises(FailedPrecondition, match="model 'stories' is pinned: unpin it "
                                                     r"first \(corral unpin stories\), or "
                                                     "unload it with --force"):
            c.unload("stories")
        assert c.status("stories").models[0].state.value == "resident"
        assert c.unload("stories", force=True) == "model 'stories' unpinned and unloaded"
        m = c.status("stories").models[0]
        assert m.state.value == "unloaded" and not m.pinned
    # The same through the CLI, and ps shows it.
    e = stories.endpoint
    assert cli("pin", "stories-q4", endpoint=e).stdout == b"pinned stories-q4\n"
    r = cli("unload", "stories-q4", endpoint=e)
    assert r.returncode == 1 and b"is pinned" in r.stderr and b"--force" in r.stderr, r.stderr
    ps = cli("ps", endpoint=e).stdout.decode()
    assert re.search(r"stories-q4\s+resident\s+.*\byes\n", ps), ps
    assert cli("unload", "stories-q4", "--force", endpoint=e).returncode == 0
    ps = cli("ps", endpoint=e).stdout.decode()
    assert re.search(r"stories-q4\s+unloaded\s+.*\bno\n", ps), ps


# --- corral add, rm, show ------------------------------------------------------------------------


CONFIG_WITH_COMMENTS = """\
# my corral configuration
listen: ["$IPC"]            # where corrald listens

models:                     # what it serves
  - name: stories           # the tiny one
    path: {stories}
    context: 512

  # quantized, for later
  - name: q4
    path: {q4}   # Q4_0

# apps come last
apps: []
"""


def test_add_and_rm_keep_the_file_and_reload_the_daemon(start_corrald, tmp_path: Path):
    body = CONFIG_WITH_COMMENTS.format(stories=STORIES,
                                       q4=shared_path("models/stories260K-q4_0.gguf"))
    d = start_corrald(body)
    path = Path(d.config_path)
    before = path.read_text()
    r = cli("add", "synth", SYNTH, "--context", "256", "--template", "chatml", "--adapter",
            "none.gguf:0.5", endpoint=d.endpoint)
    assert r.returncode == 1 and b"none.gguf" in r.stderr  # an adapter that is not there
    r = cli("add", "synth", SYNTH, "--context", "256", "--template", "chatml", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    assert f"added to {path}" in r.stderr.decode() and b"reloaded" in r.stderr, r.stderr
    after = path.read_text()
    # Every line of the file is still there, in order; the entry follows the last one.
    added = [line for line in after.splitlines() if line not in before.splitlines()]
    assert added == ['  - name: "synth"', f'    path: "{SYNTH}"', "    context: 256",
                     '    template: "chatml"'], added
    assert [line for line in after.splitlines() if line in before.splitlines()] == \
        before.splitlines()
    assert after.index('name: "synth"') > after.index("# Q4_0") > 0
    with Client(d.endpoint, timeout=30) as c:
        info = {m.name: m for m in c.list_models()}["synth"]
        assert info.context == 256 and info.chat_template == "chatml"
        assert c.generate("synth", "x", max_tokens=2, temperature=0)  # it serves
    # Mistakes are refused by name, the file untouched.
    for args, want in (
        (("add", "synth", SYNTH), b"a model 'synth' is already configured"),
        (("add", "x", str(path)), b"not a GGUF file"),
        (("add", "x", SYNTH, "--template", "chatmll"), b"did you mean 'chatml'?"),
        (("rm", "sinth"), b"configures no model 'sinth' (did you mean 'synth'?)"),
    ):
        r = cli(*args, endpoint=d.endpoint)
        assert r.returncode == 1 and want in r.stderr, (args, r.stderr)
    assert path.read_text() == after
    # rm takes the entry's lines out, and nothing else.
    r = cli("rm", "q4", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    gone = [line for line in after.splitlines() if line not in path.read_text().splitlines()]
    assert gone == ["  - name: q4", f"    path: {shared_path('models/stories260K-q4_0.gguf')}"
                    "   # Q4_0"], gone
    assert "# quantized, for later" in path.read_text()
    with Client(d.endpoint, timeout=30) as c:
        assert {m.name for m in c.list_models()} == {"stories", "synth"}


def test_add_with_an_adapter_serves_the_variant_a_hand_written_entry_serves(
    start_corrald, tmp_path: Path
):
    """`corral add --adapter FILE:SCALE` writes an entry whose model is the merged variant: the
    same greedy ids as an entry written by hand with that adapter and scale, not the base's."""
    lora = shared_path("lora/stories260K-lora-r8.gguf")
    d = start_corrald(
        f"cache: {{dir: {tmp_path}/cache}}\n"
        "models:\n"
        f"  - {{name: base, path: {STORIES}, context: 256}}\n"
        f"  - {{name: by-hand, path: {STORIES}, context: 256, "
        f"adapters: [{{path: {lora}, scale: 0.5}}]}}\n"
    )
    r = cli("add", "tale", STORIES, "--context", "256", "--adapter", f"{lora}:0.5",
            endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    assert b"reloaded" in r.stderr, r.stderr
    text = Path(d.config_path).read_text()
    assert text.endswith('  - name: "tale"\n'
                         f'    path: "{STORIES}"\n'
                         "    context: 256\n"
                         "    adapters:\n"
                         f'      - {{ path: "{lora}", scale: 0.5 }}\n'), text

    def greedy(c: Client, model: str) -> list[int]:
        s = c.generate(model, "Once upon a time", temperature=0.0, max_tokens=32, stream=True)
        return [t for k in s for t in k.token_ids]

    with Client(d.endpoint, timeout=60) as c:
        tale, by_hand, base = greedy(c, "tale"), greedy(c, "by-hand"), greedy(c, "base")
        assert tale == by_hand and len(tale) == 32
        assert tale != base  # the adapter is merged, not dropped
        st = {m.name: m for m in c.status().models}
        assert [(a.path, a.scale) for a in st["tale"].adapters] == [(lora, 0.5)]
    r = cli("show", "tale", endpoint=d.endpoint)
    assert r.returncode == 0 and f"adapter:    {lora} (scale 0.5)" in r.stdout.decode(), r.stdout


def test_add_writes_a_new_config_and_show_describes_a_model(start_corrald, tmp_path: Path):
    config = tmp_path / "new" / "corral.yaml"
    r = cli("add", "stories", STORIES, "--config", str(config), "--no-reload")
    assert r.returncode == 0, r.stderr
    assert config.read_text() == f'models:\n  - name: "stories"\n    path: "{STORIES}"\n'
    # The file serves: corrald starts on it.
    d = start_corrald(config.read_text())
    r = cli("show", "stories", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    for want in (f"file:       {STORIES} (1.1 MiB, GGUF v3", "llama", "5 layers, dim 64",
                 "trained:    context 2048", "template the file's", "adapters:   none",
                 "state:      unloaded"):
        assert want in out, out
    r = cli("show", "storie", endpoint=d.endpoint)
    assert r.returncode == 1 and b"did you mean 'stories'?" in r.stderr
