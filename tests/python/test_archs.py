"""The model families beyond llama and qwen2, served by a real corrald: qwen3 (per-head norms,
wide heads), gemma3 (sliding-window attention, post norms, GeGLU), phi3 (fused attn_qkv and
gate+up) and llama with Llama 3 RoPE scaling.

For each: a LoRA variant (a synthetic adapter merged by the daemon) generates what the engine
alone generates from the file `corral merge` writes; sessions keep their conversation while their
model's weights are swapped out and back under a memory budget where two of three models fit
(the budget and the conversation are test_memory.py's); and for gemma3, a session whose
sliding-window cache has moved its rows is written to the swap directory and read back.
The references are the engine's own output run in one process (`corral run-local`), whose logits
unit.arch and unit.model check against llama.cpp's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import shared_path
from corral import Client
from test_cli_bench import corral_path
from test_memory import PROMPT, chat_turns, config, two_fit_limit

BASES = {
    "qwen3": "models/synth-qwen3-q8_0.gguf",
    "gemma3": "models/synth-gemma3-q8_0.gguf",
    "phi3": "models/synth-phi3-q4_k_m.gguf",
    "llama3rope": "models/synth-llama3rope-q8_0.gguf",
}


def corral(*args: str) -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run([corral_path(), *args], capture_output=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr.decode()
    return r


def local_text(path: Path | str, n: int) -> str:
    """The engine's greedy text after PROMPT, in this process (F16 cache, as the daemon's)."""
    out = corral("run-local", str(path), "-p", PROMPT, "-n", str(n), "--temp", "0").stdout.decode()
    assert out.startswith(PROMPT) and out.endswith("\n")
    return out[len(PROMPT):-1]


@pytest.mark.parametrize("arch", sorted(BASES))
def test_variant_is_the_merged_model(arch: str, start_corrald, tmp_path: Path) -> None:
    base = shared_path(BASES[arch])
    adapter = tmp_path / "lora.gguf"
    # A strong adapter (alpha 400 at rank 4) on every projection, phi3's fused ones included.
    corral("synth", "--lora-for", base, "--rank", "4", "--alpha", "400", "--seed", "3",
           "-o", str(adapter))
    merged = tmp_path / "merged.gguf"
    corral("merge", base, "--lora", str(adapter), "-o", str(merged))
    body = (f"cache: {{dir: {tmp_path / 'cache'}}}\nmodels:\n"
            f"  - name: base\n    path: {base}\n    context: 512\n"
            f"  - name: lora\n    path: {base}\n    context: 512\n"
            f"    adapters:\n      - {{path: {adapter}, scale: 1.0}}\n")
    d = start_corrald(body)
    with Client(d.endpoint, timeout=30) as c:
        got_base = c.generate("base", PROMPT, max_tokens=24, temperature=0.0)
        got_lora = c.generate("lora", PROMPT, max_tokens=24, temperature=0.0)
        st = {m.name: m for m in c.status().models}
    assert got_base == local_text(base, 24)
    assert got_lora == local_text(merged, 24)
    assert got_lora != got_base, "the adapter changed nothing"
    assert st["lora"].merges == 1


def synth_arch_models(folder: Path, arch: str, extra: list[str]) -> dict[str, Path]:
    """Three q8_0 models of the architecture (about 13 MiB each, seeds 1..3)."""
    models = {}
    for seed, name in enumerate(("A", "B", "C"), start=1):
        path = folder / f"{arch}-{name}.gguf"
        corral("synth", "--arch", arch, "--n-embd", "512", "--n-layer", "4", "--n-head", "8",
               "--n-head-kv", "4", "--n-ff", "1408", "--n-vocab", "512", "--n-ctx", "512",
               "--type", "q8_0", "--seed", str(seed), *extra, "-o", str(path))
        models[name] = path
    return models


ARCH_SHAPES = {
    "qwen3": ["--head-dim", "128"],  # heads wider than n_embd / n_head
    "gemma3": ["--head-dim", "96", "--n-swa", "24", "--swa-pattern", "2", "--tied"],
    "phi3": [],
}


@pytest.mark.parametrize("arch", sorted(ARCH_SHAPES))
def test_sessions_survive_swaps(arch: str, start_corrald, tmp_path: Path) -> None:
    models = synth_arch_models(tmp_path, arch, ARCH_SHAPES[arch])
    limit = two_fit_limit(models, tmp_path / "calm-probe")
    calm = start_corrald(config(models, tmp_path / "swap-calm", limit="1GiB"))
    want = chat_turns(calm.endpoint, "A", "conv")
    tight = start_corrald(config(models, tmp_path / "swap", limit=limit))
    got = chat_turns(tight.endpoint, "A", "conv", pressure=["B", "C"])
    assert got == want  # the same text, and each turn prefilled only its new tokens
    assert all(p < t for p, t in zip(got[2][1:], got[1][1:]))
    with Client(tight.endpoint) as c:
        a = {s.name: s for s in c.status().models}["A"]
    assert a.swap_outs >= 2 and a.swap_ins >= 2


def test_window_cache_swapped_out_and_back(start_corrald, tmp_path: Path) -> None:
    """A gemma3 session past its window and slack (window 24: the rows move after 536 positions)
    written to the swap directory when its model is unloaded, and read back: the next turn runs
    only its new tokens and writes what a daemon that kept the session in memory writes."""
    path = tmp_path / "gemma3-long.gguf"
    corral("synth", "--arch", "gemma3", "--n-embd", "256", "--n-layer", "2", "--n-head", "4",
           "--n-head-kv", "2", "--head-dim", "64", "--n-ff", "512", "--n-vocab", "512",
           "--n-ctx", "2048", "--n-swa", "24", "--swa-pattern", "2", "--tied", "--type", "q8_0",
           "-o", str(path))
    body = ("memory: {{swap_dir: {swap}}}\nmodels:\n"
            f"  - name: g\n    path: {path}\n    context: 2048\n")
    long_prompt = " ".join(f"{PROMPT} the {k} day" for k in range(35))

    def conversation(unload: bool) -> tuple[list[str], list[int], list[int]]:
        d = start_corrald(body.format(swap=tmp_path / f"swap-{unload}"))
        texts, prompts, prefilled = [], [], []
        text = long_prompt
        with Client(d.endpoint, timeout=60) as c:
            for turn in range(2):
                r = c.generate("g", text, session="long", max_tokens=16, temperature=0.0,
                               return_done=True)
                texts.append(r.text)
                prompts.append(r.done.prompt_tokens)
                prefilled.append(r.done.prefilled_tokens)
                text += r.text + " And then"
                if unload and turn == 0:
                    c.unload("g")
        return texts, prompts, prefilled

    kept = conversation(unload=False)
    swapped = conversation(unload=True)
    assert kept[1][0] > 600, kept  # past the window's rows: they moved
    assert swapped == kept
    assert swapped[2][1] < swapped[1][1] - 500  # the second turn came from the swapped cache
