"""Black-box tests of the engine's local tools in the `corral` CLI, run as a user runs them:
`run-local`, `tokenize-local`, `perplexity`, `logits` and `inspect` on the shared models, compared
with llama.cpp's reference outputs in ../shared/reference."""

from __future__ import annotations

import array
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


@pytest.mark.parametrize("stem", ["synth-qwen3-f32", "synth-gemma3-f32", "synth-phi3-f32",
                                  "synth-llama3rope-f32", "synth-phi3-q8_0"])
def test_run_local_prompt_ids_greedy_equals_llama_cpp(stem: str) -> None:
    """`run-local --prompt-ids` runs the reference prompt ids as given and, greedy, generates
    llama.cpp's ids (these files' margins are all above their numerical error)."""
    ref = SHARED / "reference"
    prompt = (ref / f"{stem}.greedy.prompt_ids.txt").read_text()
    r = run("run-local", str(SHARED / "models" / f"{stem}.gguf"), "--prompt-ids", prompt,
            "-n", "64", "--temp", "0", "--kv", "f32", "--ids")
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    assert f"prompt_ids: {' '.join(prompt.split())}" in err
    want = (ref / f"{stem}.greedy.ids.txt").read_text().split()
    assert f"generated_ids: {' '.join(want)}" in err


def read_f32(path: Path) -> array.array:
    values = array.array("f")
    values.frombytes(path.read_bytes())
    return values


@pytest.mark.parametrize("stem, budget, top1", [("synth-qwen3-f32", 1e-3, 32),
                                                ("synth-gemma3-q8_0", 0.5, 30),
                                                ("synth-phi3-q4_k_m", 0.5, 30)])
def test_logits_file_in_the_references_layout(stem: str, budget: float, top1: int,
                                              tmp_path: Path) -> None:
    """`corral logits` writes [positions][n_vocab] float32, the references' layout: within the
    budget of the llama.cpp reference, row by row, and its --compare says so too (quantized
    files may pick another top token where the reference's margin is below their error)."""
    ref = SHARED / "reference"
    out = tmp_path / "out.f32"
    r = run("logits", str(SHARED / "models" / f"{stem}.gguf"), "--ids",
            str(ref / f"{stem}.ids.txt"), "-o", str(out), "--compare", str(ref / f"{stem}.logits.f32"))
    assert r.returncode == 0, r.stderr.decode()
    got, want = read_f32(out), read_f32(ref / f"{stem}.logits.f32")
    assert len(got) == len(want) == 32 * 512
    assert max(abs(a - b) for a, b in zip(got, want)) <= budget
    report = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert float(report["max_abs_diff"]) <= budget
    assert int(report["top1_agree"].split("/")[0]) >= top1


def test_logits_last_rows_of_a_long_context(tmp_path: Path) -> None:
    """4096 ids, the last 32 rows: Llama 3's RoPE scaling checked 4000 positions out."""
    stem = "synth-llama3rope-f32"
    ref = SHARED / "reference"
    out = tmp_path / "long.f32"
    r = run("logits", str(SHARED / "models" / f"{stem}.gguf"), "--ids",
            str(ref / f"{stem}.long.ids.txt"), "--last", "32", "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    assert "4064..4095" in r.stderr.decode()
    got, want = read_f32(out), read_f32(ref / f"{stem}.long.logits.f32")
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) <= 1e-3


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
        (["run-local", str(STORIES), "--prompt-ids", "1 x 3"], "'x' at byte 2"),
        (["run-local", str(STORIES), "--prompt-ids", "1 512"], "id 512 at index 1"),
        (["run-local", str(STORIES), "-p", "x", "--prompt-ids", "1"], "usage"),
        (["logits", str(STORIES), "--ids", "/nonexistent.txt", "-o", "/dev/null"],
         "/nonexistent.txt"),
        (["logits", str(STORIES), "--ids", str(SHARED / "reference" / "INDEX.tsv"), "-o",
          "/dev/null"], "is not part of a token id"),
    ],
)
def test_errors_name_the_problem(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode != 0
    assert message in r.stderr.decode()
