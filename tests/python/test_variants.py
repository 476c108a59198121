"""LoRA variants served by a real corrald: a base model with adapters merged in.

The expected tokens come from the shared reference data (llama.cpp running the base with the
adapter applied at runtime, scale 1.0 and 0.5), never from corral: greedy decoding of "Once upon a
time" must give the reference's ids up to the first step whose top-1 margin is below 0.05 (where
rounding may legitimately pick the other token). The merged image is cached on disk, so a second
daemon on the same cache directory serves the variant without merging again.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import read_shared_ids, read_shared_text, shared_path
from corral import Client, NotFound
from test_cli_bench import corral_path

PROMPT = "Once upon a time"
MARGIN_FLOOR = 0.05


def reference_prefix(stem: str) -> list[int]:
    """The reference's greedy ids up to the first step whose margin is below MARGIN_FLOOR."""
    ids = read_shared_ids(f"reference/{stem}.greedy.ids.txt")
    for line in read_shared_text(f"reference/{stem}.greedy.margins.txt").splitlines():
        step, _token, margin = line.split()
        if float(margin) < MARGIN_FLOOR:
            return ids[: int(step)]
    return ids


def variants_config(cache_dir: str) -> str:
    base = shared_path("models/stories260K.gguf")
    gguf = shared_path("lora/stories260K-lora-r8.gguf")
    peft = shared_path("lora/stories260K-lora-r8-peft")
    entry = "    path: {base}\n    context: 512\n    kv_type: f32\n"
    return (
        f"cache: {{dir: {cache_dir}}}\n"
        "models:\n"
        "  - name: base\n" + entry.format(base=base) + "  - name: lora\n"
        + entry.format(base=base)
        + f"    adapters:\n      - {{path: {gguf}, scale: 1.0}}\n"
        "  - name: lora-half\n" + entry.format(base=base)
        + f"    adapters:\n      - {{path: {gguf}, scale: 0.5}}\n"
        "  - name: lora-peft\n" + entry.format(base=base)
        + f"    adapters:\n      - {{path: {peft}}}\n"
    )


def greedy_ids(c: Client, model: str, n: int) -> list[int]:
    s = c.generate(model, PROMPT, temperature=0.0, max_tokens=n, stream=True)
    return [t for k in s for t in k.token_ids]


def test_variants_match_reference_and_cache_survives_restart(start_corrald, tmp_path):
    cache = str(tmp_path / "cache")
    full = reference_prefix("stories260K__lora-r8-s100")
    half = reference_prefix("stories260K__lora-r8-s050")
    assert len(full) > 32 and len(half) > 32
    daemon = start_corrald(variants_config(cache))
    with Client(daemon.endpoint, timeout=20) as c:
        base = greedy_ids(c, "base", 64)
        got = greedy_ids(c, "lora", len(full))
        assert got == full
        assert greedy_ids(c, "lora-half", len(half)) == half
        # The PEFT directory is the same adapter: same tokens.
        assert greedy_ids(c, "lora-peft", len(full)) == full
        # The adapter matters: the base alone writes something else.
        assert base[:64] != full[:64]
        st = {m.name: m for m in c.status().models}
        assert st["lora"].base_path == shared_path("models/stories260K.gguf")
        assert [(os.path.basename(a.path), a.scale) for a in st["lora"].adapters] == [
            ("stories260K-lora-r8.gguf", 1.0)
        ]
        assert st["lora"].merges == 1 and st["lora-half"].merges == 1
        assert st["base"].base_path == "" and st["base"].adapters == ()
        listed = {m.name: m for m in c.list_models()}
        assert listed["lora-half"].adapters[0].scale == 0.5
    # The CLI shows what a variant is made of.
    ps = subprocess.run([corral_path(), "ps", "--endpoint", daemon.endpoint], capture_output=True,
                        text=True, timeout=10)
    assert ps.returncode == 0 and "stories260K-lora-r8.gguf (scale 0.5)" in ps.stdout, ps.stdout
    images = sorted(os.listdir(cache))
    assert len([f for f in images if f.endswith(".gguf")]) == 3, images

    # The next daemon on the same cache maps the merged images instead of merging again (the
    # first one stops first: a cache directory is one running daemon's at a time).
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=10) == 0
    again = start_corrald(variants_config(cache))
    with Client(again.endpoint, timeout=20) as c:
        assert greedy_ids(c, "lora", len(full)) == full
        assert greedy_ids(c, "lora-peft", len(full)) == full
        st = {m.name: m for m in c.status().models}
        assert st["lora"].merges == 0 and st["lora-peft"].merges == 0


def test_missing_adapter_stops_startup(start_corrald, tmp_path):
    from test_policies import start_expecting_failure

    body = variants_config(str(tmp_path / "cache")).replace(
        shared_path("lora/stories260K-lora-r8.gguf"), str(tmp_path / "nope.gguf")
    )
    out = start_expecting_failure(body)
    assert "nope.gguf" in out, out


def test_corrupt_adapter_fails_the_request_with_its_problem(start_corrald, tmp_path):
    # corrald checks each adapter against its base at start (a corrupt one is refused there, see
    # test_first_hour_b); one that goes bad while it runs fails its variant's requests alone.
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(Path(shared_path("lora/stories260K-lora-r8.gguf")).read_bytes())
    body = variants_config(str(tmp_path / "cache")).replace(
        shared_path("lora/stories260K-lora-r8.gguf"), str(bad)
    )
    daemon = start_corrald(body)
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with Client(daemon.endpoint, timeout=20) as c:
        with pytest.raises(Exception, match="bad.gguf"):
            c.generate("lora", PROMPT, max_tokens=4)
        # The base and the other variants are unaffected.
        assert c.generate("lora-peft", PROMPT, temperature=0.0, max_tokens=4)
        with pytest.raises(NotFound):
            c.generate("lora-nope", PROMPT, max_tokens=4)
