"""Black-box tests of the engine's local tools in the `corral` CLI, run as a user runs them:
`run-local`, `tokenize-local`, `perplexity` and `inspect` on the shared models, compared with
llama.cpp's reference outputs in ../shared/reference."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_cli_bench import corral_path

SHARED = Path(os.environ.get("CORRAL_SHARED_DIR", Path(__file__).resolve().parents[3] / "shared"))
STORIES = SHARED / "models" / "stories260K.gguf"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [corral_path(), *args], input=stdin, capture_output=True, timeout=120, check=False
    )


def test_perplexity_matches_llama_perplexity() -> None:
    want = float((SHARED / "reference" / "perplexity.txt").read_text())
    r = run("perplexity", str(STORIES), "-f", str(SHARED / "reference" / "tinystories-sample.txt"),
            "-c", "128")
    assert r.returncode == 0, r.stderr.decode()
    got = float(r.stdout.decode().strip())
    assert abs(got - want) <= 0.005 * want, (got, want)


def test_run_local_greedy_prints_prompt_then_reference_text() -> None:
    r = run("run-local", str(STORIES), "-p", "Once upon a time", "-n", "256", "--temp", "0",
            "--kv", "f32", "--ids")
    assert r.returncode == 0, r.stderr.decode()
    full = (SHARED / "reference" / "stories260K.greedy.full.txt").read_bytes()
    assert r.stdout == full + b"\n"
    err = r.stderr.decode()
    want_ids = (SHARED / "reference" / "stories260K.greedy.ids.txt").read_text().split()
    assert f"generated_ids: {' '.join(want_ids)}" in err
    for field in ("prompt:", "generation:", "tok/s", "memory:"):
        assert field in err


def test_tokenize_local_reads_stdin_exactly() -> None:
    want = (SHARED / "reference" / "stories260K.greedy.prompt_ids.txt").read_text().split()
    r = run("tokenize-local", str(STORIES), stdin=b"Once upon a time")
    assert r.returncode == 0 and r.stdout.decode().split() == want
    r = run("tokenize-local", str(STORIES), "--no-bos", stdin=b"Once upon a time")
    assert r.stdout.decode().split() == want[1:]
    # A trailing newline is text like any other: it changes the ids.
    r = run("tokenize-local", str(STORIES), "--no-bos", stdin=b"Once upon a time\n")
    assert r.stdout.decode().split() != want[1:]
    # Special tokens in the text are plain text unless asked for.
    plain = run("tokenize-local", str(STORIES), "--no-bos", stdin=b"</s>").stdout.split()
    parsed = run("tokenize-local", str(STORIES), "--no-bos", "--parse-special",
                 stdin=b"</s>").stdout.split()
    assert parsed == [b"2"] and plain != [b"2"]


def test_inspect_lists_metadata_and_tensors() -> None:
    r = run("inspect", str(STORIES))
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "general.architecture" in out and '"llama"' in out
    assert "tokenizer.ggml.tokens" in out and "[string x 512]" in out
    assert "blk.4.ffn_down.weight" in out and "tensors (48)" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["run-local", str(SHARED / "models" / "legacy-v1.gguf"), "-p", "x"], "version 1"),
        (["run-local", "/nonexistent.gguf", "-p", "x"], "/nonexistent.gguf"),
        (["inspect", str(SHARED / "reference" / "INDEX.tsv")], "INDEX.tsv"),
        (["run-local", str(STORIES), "-p", "x", "--temp", "-1"], "--temp"),
        (["run-local", str(STORIES)], "usage"),
        (["perplexity", str(STORIES), "-f", str(SHARED / "reference" / "perplexity.txt")],
         "at least 2"),
    ],
)
def test_errors_name_the_problem(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode != 0
    assert message in r.stderr.decode()
