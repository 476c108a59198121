"""The example programs in clients/python/examples run against a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "clients", "python", "examples")


def run_example(daemon, name: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, CORRAL_ENDPOINT=daemon.endpoint)
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc


def test_examples_run(stories):
    # Greedy by config default is not assumed: only the shape of each program's output is.
    out = run_example(stories, "generate.py", "stories", "Once upon a time", "16")
    assert out.stdout.startswith("Once upon a time") and "16 generated" in out.stderr
    out = run_example(stories, "stream.py", "stories", "Once upon a time", "16")
    assert out.stdout.startswith("Once upon a time") and "[max_tokens]" in out.stderr
    out = run_example(stories, "async_generate.py", "stories", "Once upon a time", "Tom")
    assert "--- 'Once upon a time'" in out.stdout and "--- 'Tom'" in out.stdout
    out = run_example(stories, "chat.py", "stories", stdin="Once upon a time\nThe end\n\n")
    assert out.stderr.count("prompt tokens run") == 2


def test_example_reports_errors(stories):
    env = dict(os.environ, CORRAL_ENDPOINT=stories.endpoint)
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "generate.py"), "nope", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "NOT_FOUND" in proc.stderr
