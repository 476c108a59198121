"""Many apps at once: 16 concurrent clients — 8 `corral run` processes (the C library) and 8
Python clients — each make 10 greedy requests alternating between two models. Every one of the
160 requests must return exactly the text a lone request gets, and the daemon's Status and
`corral ps --json` must agree with what happened."""

from __future__ import annotations

import json
import subprocess
import threading

from conftest import read_shared_text
from corral import Client
from test_cli_bench import corral_path

MODELS = ("stories", "stories-q4")
REFERENCE = {"stories": "stories260K", "stories-q4": "stories260K-q4_0"}
PROMPT = "Once upon a time"
N_TOKENS = 32  # both models follow their llama.cpp greedy references well past this point
N_CLIENTS_PER_KIND = 8
N_REQUESTS = 10


def test_sixteen_clients_c_and_python(stories):
    # What a lone greedy request returns; it must itself be llama.cpp's greedy text (a prefix of
    # the 256-token reference).
    with Client(stories.endpoint, timeout=30) as c:
        expected = {m: c.generate(m, PROMPT, max_tokens=N_TOKENS, temperature=0.0) for m in MODELS}
    for m in MODELS:
        reference = read_shared_text(f"reference/{REFERENCE[m]}.greedy.txt")
        assert expected[m] and reference.startswith(expected[m]), (m, expected[m])

    failures: list[str] = []
    lock = threading.Lock()

    def python_client(k: int) -> None:
        with Client(stories.endpoint, app=f"py{k}", timeout=60) as c:
            for i in range(N_REQUESTS):
                m = MODELS[(k + i) % 2]
                text = c.generate(m, PROMPT, max_tokens=N_TOKENS, temperature=0.0)
                if text != expected[m]:
                    with lock:
                        failures.append(f"python client {k} request {i} on {m}: {text!r}")

    def c_client(k: int) -> None:
        for i in range(N_REQUESTS):
            m = MODELS[(k + i) % 2]
            r = subprocess.run(
                [corral_path(), "--endpoint", stories.endpoint, "--app", f"c{k}", "run", m,
                 PROMPT, "-n", str(N_TOKENS), "--temp", "0"],
                capture_output=True, timeout=60, check=False,
            )
            if r.returncode != 0 or r.stdout.decode() != expected[m]:
                with lock:
                    failures.append(f"C client {k} request {i} on {m}: exit {r.returncode}, "
                                    f"{r.stdout!r} {r.stderr!r}")

    threads = [threading.Thread(target=python_client, args=(k,)) for k in range(N_CLIENTS_PER_KIND)]
    threads += [threading.Thread(target=c_client, args=(k,)) for k in range(N_CLIENTS_PER_KIND)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n".join(failures[:10])

    # 160 concurrent requests plus the two lone ones, 81 per model.
    per_model = 2 * N_CLIENTS_PER_KIND * N_REQUESTS // 2 + 1
    with Client(stories.endpoint, timeout=10) as c:
        status = c.status()
    served = {m.name: m.requests_served for m in status.models}
    assert served == {m: per_model for m in MODELS}
    assert status.daemon.requests_served == 2 * per_model
    assert status.daemon.active == 0 and status.daemon.queued == 0

    ps = subprocess.run([corral_path(), "--endpoint", stories.endpoint, "ps", "--json"],
                        capture_output=True, check=True, timeout=30)
    listing = json.loads(ps.stdout)
    assert {m["name"]: m["requests_served"] for m in listing["models"]} == served
    assert {m["name"]: m["state"] for m in listing["models"]} == {m: "resident" for m in MODELS}
    assert listing["total_bytes"] == sum(m["bytes"] for m in listing["models"]) > 0
