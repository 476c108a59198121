"""Black-box tests of `corral synth` and `corral bench --json`: the binary is run as a user runs it.

The binary comes from CORRAL (scripts/run-tests sets it), or from next to CORRALD's build tree.
Timings are only checked for being measured and consistent with each other, never against
thresholds: performance is the benchmarks' business, not the tests'.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REQUIRED_KEYS = {
    "pp_tok_s": float,
    "pp_tok_s_min": float,
    "pp_tok_s_max": float,
    "tg_tok_s": float,
    "tg_tok_s_min": float,
    "tg_tok_s_max": float,
    "bytes_per_token": int,
    "bandwidth_gb_s": float,
    "bandwidth_gb_s_min": float,
    "bandwidth_gb_s_max": float,
    "ceiling_fraction": float,
    "ceiling_fraction_min": float,
    "ceiling_fraction_max": float,
    "load_ms_warm": float,
    "load_ms_cold": float,
    "peak_rss_bytes": int,
    "huge_page_fraction": float,
    "threads": int,
    "cpu_path": str,
}


def corral_path() -> str:
    path = os.environ.get("CORRAL")
    if not path and os.environ.get("CORRALD"):
        # build/daemon/corrald -> build/clients/cli/corral
        path = str(Path(os.environ["CORRALD"]).parent.parent / "clients" / "cli" / "corral")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("CORRAL is not set (or not executable): run the Python tests through "
                    "`make test` or scripts/run-tests")
    return path


# bench keeps the weights it rearranges for the kernels in a cache directory between loads; the
# tests give it one of their own instead of the machine's.
CACHE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / f"corral-test-bench-cache-{os.getpid()}"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORRAL_CACHE_DIR=str(CACHE_DIR))
    proc = subprocess.run([corral_path(), *args], capture_output=True, text=True, timeout=600,
                          env=env)
    if check and proc.returncode != 0:
        pytest.fail(f"corral {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module", autouse=True)
def cache_dir():
    yield CACHE_DIR
    shutil.rmtree(CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "tiny-q4_0.gguf"
    run("synth", "--n-embd", "128", "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2",
        "--n-ff", "256", "--n-vocab", "300", "--n-ctx", "128", "--type", "q4_0",
        "-o", str(path))
    return path


def as_number(value, key: str) -> float:
    assert isinstance(value, (int, float)) and not isinstance(value, bool), \
        f"{key} = {value!r} is not a number"
    assert math.isfinite(value), f"{key} = {value!r}"
    return float(value)


def test_bench_json_has_every_key(tiny_model: Path):
    proc = run("bench", str(tiny_model), "-t", "2", "-p", "16", "-n", "4", "-r", "3",
               "--bw-mib", "64", "--json")
    result = json.loads(proc.stdout)  # exactly one JSON document, nothing else on stdout
    assert isinstance(result, dict)
    for key, kind in REQUIRED_KEYS.items():
        assert key in result, f"missing {key}: {sorted(result)}"
        if kind is str:
            assert isinstance(result[key], str) and result[key], key
        else:
            as_number(result[key], key)

    for key in ("pp_tok_s", "tg_tok_s", "bandwidth_gb_s", "ceiling_fraction"):
        lo, mid, hi = (as_number(result[key + s], key) for s in ("_min", "", "_max"))
        assert 0 < lo <= mid <= hi, (key, lo, mid, hi)
    assert result["threads"] == 2
    assert result["n_prompt"] == 16 and result["n_gen"] == 4 and result["reps"] == 3

    size = tiny_model.stat().st_size
    weight_bytes = result["weight_bytes"]
    assert 0 < weight_bytes <= size
    # An untied token_embd is read one row per token, so bytes/token may be below the weights,
    # but never below the layers' and output's share, nor above weights + a whole KV cache.
    assert weight_bytes // 2 < result["bytes_per_token"] < weight_bytes + 2 * 128 * 64 * 2 * 2
    # Each tg run is set against the bandwidth measured right after it, so every run's fraction,
    # and with them the reported ones, lies within what the extremes of both allow.
    per_byte = result["bytes_per_token"] / 1e9
    lowest = result["tg_tok_s_min"] * per_byte / result["bandwidth_gb_s_max"]
    highest = result["tg_tok_s_max"] * per_byte / result["bandwidth_gb_s_min"]
    assert lowest * (1 - 1e-4) <= result["ceiling_fraction_min"], (lowest, result)
    assert result["ceiling_fraction_max"] <= highest * (1 + 1e-4), (highest, result)
    assert result["load_ms_warm"] > 0 and result["load_ms_cold"] > 0
    assert 0 < result["ready_ms_warm"] <= result["load_ms_warm"]
    # The first load left the rearranged weights in the cache directory for the later ones.
    assert list(CACHE_DIR.glob("repack-tiny-q4_0-*.gguf")), list(CACHE_DIR.iterdir())
    assert result["peak_rss_bytes"] > size
    assert 0 <= result["cold_resident_fraction"] <= 1
    # On Linux with /proc (the only platform corral runs on) the share is always known.
    assert 0 <= result["huge_page_fraction"] <= 1
    # The engine's kernel table ("avx512+vnni", "scalar", ...), not the CPU's feature list.
    assert re.fullmatch(r"[a-z0-9+_]+", result["cpu_path"]), result["cpu_path"]


def test_bench_json_one_run_pairs_tg_with_its_bandwidth(tiny_model: Path):
    proc = run("bench", str(tiny_model), "-t", "1", "-p", "0", "-n", "4", "-r", "1",
               "--bw-mib", "64", "--no-cold", "--json")
    result = json.loads(proc.stdout)
    bandwidth = result["bandwidth_gb_s"]
    assert result["bandwidth_gb_s_min"] == bandwidth == result["bandwidth_gb_s_max"] > 0
    expected = result["tg_tok_s"] / (bandwidth * 1e9 / result["bytes_per_token"])
    for key in ("ceiling_fraction", "ceiling_fraction_min", "ceiling_fraction_max"):
        assert result[key] == pytest.approx(expected, rel=1e-4), key
    assert result["pp_tok_s"] is None


def test_bench_json_skipped_phases_are_null(tiny_model: Path):
    proc = run("bench", str(tiny_model), "-t", "1", "-p", "8", "-n", "0", "-r", "1",
               "--bw-mib", "64", "--no-cold", "--json")
    result = json.loads(proc.stdout)
    assert result["pp_tok_s"] > 0
    assert result["tg_tok_s"] is None and result["ceiling_fraction"] is None
    assert result["ceiling_fraction_min"] is None and result["ceiling_fraction_max"] is None
    assert result["bandwidth_gb_s"] > 0  # measured once, after the prompt runs
    assert result["load_ms_cold"] is None
    assert result["threads"] == 1


def test_bench_human_output(tiny_model: Path):
    proc = run("bench", str(tiny_model), "-p", "8", "-n", "2", "-r", "1", "--bw-mib", "64")
    for word in ("pp8", "tg2", "bandwidth", "ceiling", "load", "peak RSS"):
        assert word in proc.stdout, proc.stdout


def test_bench_rejects_bad_arguments(tiny_model: Path):
    proc = run("bench", str(tiny_model), "-p", "0", "-n", "0", check=False)
    assert proc.returncode == 2 and "-p and -n" in proc.stderr
    proc = run("bench", str(tiny_model), "-p", "4096", "-n", "0", check=False)
    assert proc.returncode == 1 and "context of 128" in proc.stderr
    proc = run("bench", "/nonexistent/model.gguf", check=False)
    assert proc.returncode == 1 and "/nonexistent/model.gguf" in proc.stderr


def test_synth_is_deterministic(tmp_path: Path):
    args = ["synth", "--like", "smollm2-135m", "--n-layer", "1", "--n-vocab", "512",
            "--type", "q4_k_m", "--seed", "5"]
    run(*args, "-o", str(tmp_path / "a.gguf"))
    run(*args, "-t", "1", "-o", str(tmp_path / "b.gguf"))
    run(*args[:-1], "6", "-o", str(tmp_path / "c.gguf"))
    a, b, c = ((tmp_path / n).read_bytes() for n in ("a.gguf", "b.gguf", "c.gguf"))
    assert a == b
    assert a != c and len(a) == len(c)


def test_synth_rejects_bad_arguments(tmp_path: Path):
    out = str(tmp_path / "x.gguf")
    cases = [
        (["--like", "llama-70b", "--type", "q4_0"], ["llama-70b", "tinyllama-1.1b"]),
        (["--like", "tinyllama-1.1b", "--type", "q3_k"], ["q3_k", "q4_k_m"]),
        (["--like", "tinyllama-1.1b", "--type", "q4_0", "--n-head", "30"],
         ["n_embd = 2048", "n_head = 30"]),
        (["--like", "tinyllama-1.1b", "--type", "q4_0", "--n-head-kv", "5"],
         ["n_head = 32", "n_head_kv = 5"]),
        (["--n-embd", "64", "--type", "f32"], ["--n-layer"]),
        (["--like", "tinyllama-1.1b", "--type", "f32", "--arch", "gpt2"], ["gpt2"]),
    ]
    for extra, words in cases:
        proc = run("synth", *extra, "-o", out, check=False)
        assert proc.returncode == 2, (extra, proc.returncode, proc.stderr)
        for word in words:
            assert word in proc.stderr, (extra, proc.stderr)
        assert not os.path.exists(out)
