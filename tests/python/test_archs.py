"""The model families beyond llama and qwen2, served by a real corrald: qwen3 (per-head norms,
wide heads), gemma3 (sliding-window attention, post norms, GeGLU), phi3 (fused attn_qkv and
gate+up) and llama with Llama 3 RoPE scaling.

For each: a LoRA variant (a synthetic adapter merged by the daemon) generates what the engine
alone generates from the file `corral merge` writes; sessions keep their conversation while their
model's weights are swapped out and back under a memory budget where two of three models fit
(the budget and the conversation are test_memory.py's); and for gemma3, a session whose
sliding-window cache has moved its rows is written to the swap directory and read back. A model
configured beyond 4,096 positions serves a prompt longer than that.
The references are the engine's own output run in one process (`corral run-local`), whose logits
unit.arch and unit.model check against llama.cpp's.
"""

from __future__ import annotations

import json
import math
import re
import struct
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


def gguf_parse(path: Path) -> tuple[dict, list[tuple[str, list[int], int, int]], bytes]:
    """A GGUF file's metadata, its tensor infos (name, ne, type, offset) and its data section."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode()

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}

    def value(t: int):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF"
    pos = 8
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [take("Q") for _ in range(take("I"))]
        infos.append((name, ne, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    return meta, infos, data[(pos + align - 1) // align * align:]


def gguf_f32_tensors(path: Path) -> tuple[dict, dict[str, tuple[list[int], bytes]]]:
    """An F32-only GGUF file's metadata and tensors: name -> (ne, bytes)."""
    meta, infos, blob = gguf_parse(path)
    tensors = {}
    for name, ne, typ, offset in infos:
        assert typ == 0, name  # F32
        tensors[name] = (ne, blob[offset:offset + 4 * math.prod(ne)])
    return meta, tensors


def write_peft(adapter_gguf: Path, folder: Path) -> Path:
    """The same adapter as a Hugging Face PEFT directory: llama.cpp's GGUF LoRA and PEFT store
    lora_A (r x n_in) and lora_B (n_out x r) in the same row-major order, under other names."""
    meta, tensors = gguf_f32_tensors(adapter_gguf)
    modules = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "attn_qkv": "self_attn.qkv_proj", "ffn_gate": "mlp.gate_proj",
               "ffn_down": "mlp.down_proj"}
    fused = any(".attn_qkv." in name for name in tensors)
    modules["ffn_up"] = "mlp.gate_up_proj" if fused else "mlp.up_proj"
    header, blobs, offset, rank, targets = {}, [], 0, 0, set()
    for name, (ne, blob) in sorted(tensors.items()):
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])", name)
        assert m, name
        module = modules[m.group(2)]
        targets.add(module.split(".")[-1])
        hf = f"base_model.model.model.layers.{m.group(1)}.{module}.lora_{m.group(3).upper()}.weight"
        header[hf] = {"dtype": "F32", "shape": [ne[1], ne[0]],
                      "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
        rank = ne[1] if m.group(3) == "a" else ne[0]
    folder.mkdir()
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    (folder / "adapter_model.safetensors").write_bytes(
        struct.pack("<Q", len(head)) + head + b"".join(blobs))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        "lora_alpha": meta["adapter.lora.alpha"], "target_modules": sorted(targets),
        "bias": "none", "fan_in_fan_out": False, "use_dora": False, "use_rslora": False}))
    return folder


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_peft_adapter_merges_as_its_gguf_twin(arch: str, tmp_path: Path) -> None:
    """A PEFT adapter maps onto the new architectures' tensors (phi3: qkv_proj and gate_up_proj
    onto the fused attn_qkv and ffn_up), with the same result as the GGUF adapter it was made
    from."""
    base = shared_path(BASES[arch])
    adapter = tmp_path / "lora.gguf"
    corral("synth", "--lora-for", base, "--rank", "4", "--alpha", "400", "--seed", "5",
           "-o", str(adapter))
    peft = write_peft(adapter, tmp_path / "peft")
    for name, source in (("gguf", adapter), ("peft", peft)):
        corral("merge", base, "--lora", str(source), "-o", str(tmp_path / f"{name}.gguf"))
    # The same tensors, byte for byte (the metadata differs: it names the adapter files).
    _, infos_a, data_a = gguf_parse(tmp_path / "gguf.gguf")
    _, infos_b, data_b = gguf_parse(tmp_path / "peft.gguf")
    assert infos_a == infos_b and data_a == data_b
    assert local_text(tmp_path / "peft.gguf", 16) != local_text(base, 16)


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


def test_a_context_beyond_4096_positions_is_served(start_corrald) -> None:
    """A model configured with 8,192 positions (Llama 3 RoPE scaling, trained for 8,192) serves a
    prompt of more than 5,000 tokens: the daemon's greedy text equals the engine's in one process,
    and Done counts the whole prompt (no cap at 4,096 anywhere between the config and the cache)."""
    base = shared_path("models/synth-llama3rope-f32.gguf")
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "into"]
    prompt = " ".join(words[(i * 7 + i // 5) % len(words)] for i in range(3000))
    d = start_corrald(f"models:\n  - name: long\n    path: {base}\n    context: 8192\n")
    with Client(d.endpoint, timeout=120) as c:
        assert {m.name: m for m in c.list_models()}["long"].context == 8192
        r = c.generate("long", prompt, max_tokens=8, temperature=0.0, return_done=True)
    assert r.done.prompt_tokens > 4096, r.done
    out = corral("run-local", base, "-p", prompt, "-n", "8", "--temp", "0", "-c", "8192")
    text = out.stdout.decode()
    assert text.startswith(prompt) and text.endswith("\n")
    assert r.text == text[len(prompt):-1]
    assert r.done.generated_tokens == 8, r.done  # greedy on this file: no end token in 8
