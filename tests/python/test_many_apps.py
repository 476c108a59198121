"""Many apps at once, over real ZeroMQ: slow work never blocks compute, a burst loads a model
once, and a streamed token costs the core no allocation.

The slow work is real: a LoRA variant of a 45 MB synthetic model is merged on the loader, and an
82 MB one is loaded with a fresh cache directory (its rearranged weights written on the way).
The checks are orderings (the realtime request is answered while the other model still shows
LOADING), never timings.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import shared_path
from corral import Client
from test_cli_bench import corral_path

PROMPT = "Once upon a time"


def synth(path: Path, width: int, layers: int, ff: int) -> Path:
    subprocess.run(
        [corral_path(), "synth", "--arch", "llama", "--n-embd", str(width), "--n-layer",
         str(layers), "--n-head", "8", "--n-head-kv", "4", "--n-ff", str(ff), "--n-vocab", "512",
         "--n-ctx", "512", "--type", "q8_0", "--seed", "3", "-o", str(path)],
        check=True, capture_output=True, timeout=300,
    )
    return path


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> dict[str, Path]:
    """A model whose merge, and one whose cold load, take long enough to act on meanwhile."""
    d = tmp_path_factory.mktemp("many-apps")
    merge_base = synth(d / "merge-base.gguf", 768, 6, 2048)
    adapter = d / "merge-lora.gguf"
    subprocess.run([corral_path(), "synth", "--lora-for", str(merge_base), "--rank", "32",
                    "-o", str(adapter)], check=True, capture_output=True, timeout=300)
    return {"merge_base": merge_base, "adapter": adapter,
            "cold": synth(d / "cold.gguf", 1024, 6, 2816)}


def config(slow: dict[str, Path]) -> str:
    return (
        "limits: {active_per_model: 8}\n"
        "apps:\n  - name: speaker\n    max_priority: realtime\n"
        "models:\n"
        f"  - name: stories\n    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n    preload: true\n"
        f"  - name: stories-q4\n    path: {shared_path('models/stories260K-q4_0.gguf')}\n"
        "    context: 512\n"
        f"  - name: variant\n    path: {slow['merge_base']}\n    context: 256\n"
        f"    adapters: [{{path: {slow['adapter']}, scale: 1.0}}]\n"
        f"  - name: cold\n    path: {slow['cold']}\n    context: 256\n"
    )


def state(c: Client, model: str) -> str:
    return {s.name: s for s in c.status().models}[model].state.name


def wait_for_state(c: Client, model: str, want: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while state(c, model) != want:
        assert time.monotonic() < deadline, f"{model} never became {want}"
        time.sleep(0.001)


@pytest.mark.parametrize("slow_model", ["variant", "cold"])
def test_a_realtime_request_is_answered_while_another_model_loads(slow, start_corrald,
                                                                   slow_model):
    d = start_corrald(config(slow))
    results: dict[str, object] = {}

    def load_it() -> None:
        with Client(d.endpoint, timeout=120) as c:
            results["slow"] = c.generate(slow_model, PROMPT, max_tokens=2, temperature=0.0)

    loader = threading.Thread(target=load_it)
    loader.start()
    with Client(d.endpoint, timeout=60, app="speaker") as c:
        wait_for_state(c, slow_model, "LOADING")
        text = c.generate("stories", PROMPT, max_tokens=8, temperature=0.0, priority="realtime")
        assert text
        # The ordering, not a time: the other model is still being merged or loaded.
        assert state(c, slow_model) == "LOADING", "the load ended before the realtime answer"
    loader.join(timeout=300)
    assert results.get("slow"), results
    log = d.log()
    if slow_model == "variant":
        assert "variant merged" in log
    assert "repacked weights written" in log


def test_a_merge_steps_aside_while_realtime_work_runs(slow, start_corrald):
    """A background request's variant is merged on the loader; while a realtime stream is being
    computed the merge pauses between tensors (it would take a core from the stream's steps),
    and goes on once the stream is done. Checked by the merge's own progress reports received
    while the stream is still running, never by a time."""
    d = start_corrald(config(slow))
    with Client(d.endpoint, timeout=60, app="speaker") as speaker:
        speaker.generate("cold", PROMPT, max_tokens=1, temperature=0.0)  # resident first
        realtime = speaker.generate("cold", PROMPT, max_tokens=200, temperature=0.0,
                                    priority="realtime", stream=True)
        next(realtime)  # the realtime work is in hand from here to its Done
        merging: list[tuple[int, int]] = []
        result: dict[str, object] = {}

        def background() -> None:
            with Client(d.endpoint, timeout=300) as c:
                s = c.generate("variant", PROMPT, max_tokens=2, temperature=0.0, stream=True,
                               priority="background")
                s.on_progress = lambda p: merging.append((p.done, p.total)) \
                    if p.phase.name == "MERGING" else None
                result["text"] = "".join(k.text for k in s)

        thread = threading.Thread(target=background)
        thread.start()
        seen_while_realtime: list[tuple[int, int]] = []
        for chunk in realtime:
            # Tokens ahead of the stream's end: the realtime work is still being computed, so
            # every report received so far was made while it was.
            if chunk.index == 150:
                seen_while_realtime = list(merging)
        assert realtime.done is not None and realtime.done.generated_tokens == 200
        thread.join(timeout=300)
    assert "text" in result, "the background request did not finish"
    assert merging and merging[-1][0] == merging[-1][1] > 2, merging
    most = max((done for done, _ in seen_while_realtime), default=0)
    assert most <= 2, (
        f"the merge went on to tensor {most} of {merging[-1][1]} while realtime work ran")


def test_a_burst_of_requests_for_an_unloaded_model_loads_it_once(slow, start_corrald):
    d = start_corrald(config(slow))
    texts: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        with Client(d.endpoint, timeout=60) as c:
            t = c.generate("stories-q4", PROMPT, max_tokens=8, temperature=0.0)
        with lock:
            texts.append(t)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(texts) == 16 and len(set(texts)) == 1, texts
    with Client(d.endpoint, timeout=10) as c:
        m = {s.name: s for s in c.status().models}["stories-q4"]
    assert m.loads == 1 and m.requests_served == 16, m


def test_a_streamed_token_costs_the_core_no_allocation(start_corrald):
    d = start_corrald(
        f"models:\n  - name: stories\n    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n")
    with Client(d.endpoint, timeout=30) as c:
        if c.status().daemon.allocated_bytes == 0:
            pytest.skip("jemalloc is not the allocator (sanitizer build)")

        def cost(stop: str) -> tuple[int, int]:
            """Bytes the core allocated for one streamed greedy request, and its tokens. Every
            request is set up alike (same prompt, max_tokens, one stop string of 4 bytes): they
            differ only in how many tokens they stream."""
            before = c.status().daemon.allocated_bytes
            n = sum(len(ch.token_ids) for ch in c.generate(
                "stories", PROMPT, stream=True, temperature=0.0, max_tokens=200, stop=[stop]))
            return c.status().daemon.allocated_bytes - before, n

        cost("@@@@")  # warm: the model's first request sets up what stays
        costs = []
        for _ in range(3):
            short, n_short = cost("Lily")  # the greedy text names Lily within a dozen tokens
            long, n_long = cost("@@@@")    # never appears: 200 tokens
            assert n_short < 20 and n_long == 200, (n_short, n_long)
            costs.append(long - short)
    # One allocation of the smallest size class (8 bytes) per token would be 1,440 bytes or more.
    assert min(costs) < 180, costs


def test_concurrent_greedy_requests_batched_give_the_texts_they_give_alone(start_corrald):
    """Eight prompts of different lengths, run one after another and then all at once: batched
    in shared forward passes (prefill chunks beside other sequences' decode tokens), every text
    must be exactly the lone one."""
    d = start_corrald(
        "limits: {active_per_model: 8, prefill_chunk: 16}\n"
        f"models:\n  - name: synth\n    path: {shared_path('models/synth-llama-q8_0.gguf')}\n"
        "    context: 512\n")
    prompts = [PROMPT + " " + "there was a little" * k for k in range(8)]
    with Client(d.endpoint, timeout=60) as c:
        alone = [c.generate("synth", p, max_tokens=40, temperature=0.0)
                 for p in prompts]
        before = {s.name: s for s in c.status().models}["synth"]
    assert all(alone) and len(set(alone)) == len(prompts), alone
    together: list[str | None] = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        with Client(d.endpoint, timeout=120) as c:
            start.wait()
            together[i] = c.generate("synth", prompts[i], max_tokens=40, temperature=0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    with Client(d.endpoint, timeout=10) as c:
        after = {s.name: s for s in c.status().models}["synth"]
    steps = after.steps - before.steps
    sequences = after.step_sequences - before.step_sequences
    # They did share passes: more sequences than steps.
    assert sequences > steps > 0, (steps, sequences)
