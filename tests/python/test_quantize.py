"""`corral quantize`, `corral imatrix`, `corral perplexity --kl-divergence`, `corral merge --type`
and the daemon's `quantize:` model entries, through the real binaries.

The references are llama.cpp's: the shared synth-*-q*.gguf files were made by llama-quantize from
the synth-*-f32.gguf files, and where ../shared/tools/llama.cpp/llama-quantize runs, every type,
mixture and option is checked beside it, whole files byte for byte (with an importance matrix
from `corral imatrix`, which llama-quantize thereby reads). The quality claims are measured as KL
divergence from the F32 model on held-back text, the first half of the TinyStories sample being
the calibration text: the sample's second half, or, where the difference to resolve is a few
percent, forty stories written by stories260K (about 6,000 scored tokens instead of 384).
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess

import pytest

from conftest import shared_path
from corral import Client
from test_cli_bench import corral_path

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
         "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "F16", "BF16"]


# ---- a GGUF reader (enough for comparing tensors) ---------------------------------------------

def read_gguf(path: str) -> tuple[dict, list[tuple[str, int, tuple, bytes]]]:
    """(metadata, [(name, type, shape, data)]) of a GGUF file, tensors in file order."""
    with open(path, "rb") as f:
        b = f.read()
    assert b[:4] == b"GGUF", path
    _ver, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    o = 24
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
              10: "<Q", 11: "<q", 12: "<d"}

    def string(o: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", b, o)
        return b[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n

    def value(t: int, o: int):
        if t == 8:
            return string(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            items = []
            for _ in range(n):
                v, o = value(et, o)
                items.append(v)
            return items, o
        fmt = scalar[t]
        return struct.unpack_from(fmt, b, o)[0], o + struct.calcsize(fmt)

    kv = {}
    for _ in range(n_kv):
        k, o = string(o)
        (t,) = struct.unpack_from("<I", b, o)
        kv[k], o = value(t, o + 4)
    infos = []
    for _ in range(n_t):
        name, o = string(o)
        (nd,) = struct.unpack_from("<I", b, o)
        ne = struct.unpack_from(f"<{nd}Q", b, o + 4)
        t, off = struct.unpack_from("<IQ", b, o + 4 + 8 * nd)
        o += 4 + 8 * nd + 12
        infos.append((name, t, ne, off))
    align = kv.get("general.alignment", 32)
    data = (o + align - 1) // align * align
    sizes = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
             8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}
    tensors = []
    for name, t, ne, off in infos:
        n = 1
        for d in ne:
            n *= d
        blk, size = sizes[t]
        tensors.append((name, t, ne, b[data + off:data + off + n // blk * size]))
    return kv, tensors


def run(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run([corral_path(), *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"corral {' '.join(args)}: {p.stderr}"
    return p


def llama_quantize() -> str | None:
    """../shared/tools/llama.cpp/llama-quantize, when it is there and runs here."""
    from conftest import ROOT

    base = os.environ.get("CORRAL_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
    path = os.path.join(base, "tools", "llama.cpp", "llama-quantize")
    return path if os.access(path, os.X_OK) else None


def same_tensors(a: str, b: str, by_name: bool = False) -> None:
    ta, tb = read_gguf(a)[1], read_gguf(b)[1]
    if by_name:
        ta, tb = sorted(ta), sorted(tb)
    assert [t[:3] for t in ta] == [t[:3] for t in tb], f"{a} and {b}: tensors differ"
    for x, y in zip(ta, tb):
        assert x[3] == y[3], f"{a} and {b}: {x[0]} bytes differ"


def kl(model: str, base: str, text: str, ctx: int = 64) -> float:
    out = run("perplexity", model, "-f", text, "-c", str(ctx), "--kl-divergence", base).stdout
    values = dict(line.split() for line in out.splitlines())
    return float(values["kl_divergence_mean"])


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> tuple[str, str]:
    """The TinyStories sample cut in two: calibration, then held-back text."""
    d = tmp_path_factory.mktemp("texts")
    with open(shared_path("reference/tinystories-sample.txt"), "rb") as f:
        sample = f.read()
    half = len(sample) // 2
    (d / "calib.txt").write_bytes(sample[:half])
    (d / "held.txt").write_bytes(sample[half:])
    return str(d / "calib.txt"), str(d / "held.txt")


@pytest.fixture(scope="module")
def stories(tmp_path_factory) -> str:
    """Held-back text long enough to tell a KL divergence 2% lower from noise: forty TinyStories
    written by stories260K (sampled, seeds 1 to 40, 300 tokens each; none of it is calibration
    text). The sample's held-back half scores only 384 tokens, over which two quantizations of
    random weights differ by more than an importance matrix's gain."""
    path = tmp_path_factory.mktemp("stories") / "stories.txt"
    model = shared_path("models/stories260K.gguf")
    text = "".join(run("run-local", model, "-p", "Once upon a time", "-n", "300",
                       "--seed", str(seed)).stdout + "\n" for seed in range(1, 41))
    path.write_text(text)
    assert len(text) > 20000
    return str(path)


# ---- llama.cpp's files ------------------------------------------------------------------------

@pytest.mark.parametrize("ftype,pure,ref", [
    ("Q4_0", True, "q4_0"), ("Q4_1", True, "q4_1"), ("Q5_0", True, "q5_0"),
    ("Q5_1", True, "q5_1"), ("Q8_0", True, "q8_0"), ("Q4_K_S", True, "q4_k"),
    ("Q5_K_S", True, "q5_k"), ("Q6_K", True, "q6_k"), ("Q4_K_M", False, "q4_k_m"),
    ("F16", False, "f16"), ("BF16", False, "bf16"),
])
def test_matches_shared_llama_quantize_files(tmp_path, ftype, pure, ref):
    out = str(tmp_path / "out.gguf")
    args = ["quantize", "-q", shared_path("models/synth-llama-f32.gguf"), out, ftype]
    run(*(args[:1] + (["--pure"] if pure else []) + args[1:]))
    same_tensors(out, shared_path(f"models/synth-llama-{ref}.gguf"))


def test_qwen2_matches_shared_files(tmp_path):
    for ftype, ref in [("Q8_0", "q8_0"), ("F16", "f16")]:
        out = str(tmp_path / f"{ref}.gguf")
        run("quantize", "-q", shared_path("models/synth-qwen2-f32.gguf"), out, ftype)
        same_tensors(out, shared_path(f"models/synth-qwen2-{ref}.gguf"))


@pytest.mark.skipif(llama_quantize() is None, reason="no llama-quantize in ../shared/tools")
def test_beside_llama_quantize(tmp_path, texts):
    """Every type and mixture, pure or not, and every option, on both synthetic models: the whole
    file corral writes is llama-quantize's, byte for byte. With an importance matrix from
    `corral imatrix` too, and on a 16-layer model where the mixtures' layer rules all show."""
    lq = llama_quantize()
    deep = str(tmp_path / "deep.gguf")
    run("synth", "--arch", "llama", "--n-embd", "256", "--n-layer", "16", "--n-head", "4",
        "--n-head-kv", "2", "--n-ff", "512", "--n-vocab", "512", "--n-ctx", "512", "--type",
        "f32", "--untied", "--vocab-from", shared_path("models/stories260K.gguf"), "-o", deep)
    cases = []
    for model in ["synth-llama", "synth-qwen2"]:
        f = shared_path(f"models/{model}-f32.gguf")
        for t in TYPES:
            cases += [([f], t), (["--pure", f], t)]
    f = shared_path("models/synth-llama-f32.gguf")
    cases += [
        (["--output-tensor-type", "q8_0", f], "Q4_K_M"),
        (["--token-embedding-type", "q6_k", f], "Q4_K_M"),
        (["--tensor-type", "attn_v=q8_0", "--tensor-type", r"blk\.1\.ffn_.*=q5_0", f], "Q4_K_M"),
        (["--leave-output-tensor", f], "Q4_0"),
        (["--pure", "--output-tensor-type", "q6_k", f], "Q4_0"),
        (["--allow-requantize", shared_path("models/synth-llama-q8_0.gguf")], "Q6_K"),
        ([shared_path("models/synth-llama-bf16.gguf")], "Q4_K_M"),
        ([shared_path("models/stories260K.gguf")], "Q4_K_M"),
    ]
    for t in ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S"]:
        cases.append(([deep], t))
    imx = {}
    for model in ["synth-llama-f32", "deep"]:
        src = deep if model == "deep" else shared_path(f"models/{model}.gguf")
        imx[model] = str(tmp_path / f"{model}.imatrix.gguf")
        run("imatrix", src, "-f", texts[0], "-o", imx[model], "-c", "64", "-q")
    for t in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K"]:
        cases.append((["--imatrix", imx["synth-llama-f32"], f], t))
        cases.append((["--imatrix", imx["deep"], deep], t))
    for i, (args, t) in enumerate(cases):
        ours, theirs = str(tmp_path / f"c{i}.gguf"), str(tmp_path / f"l{i}.gguf")
        run("quantize", "-q", *args[:-1], args[-1], ours, t, "2")
        p = subprocess.run([lq, *args[:-1], args[-1], theirs, t, "2"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        if "--imatrix" in args:
            assert "loaded" in p.stdout and "importance matrix entries" in p.stdout, p.stdout
        with open(ours, "rb") as a, open(theirs, "rb") as b:
            assert a.read() == b.read(), f"{args} {t}: corral and llama-quantize differ"


# ---- quality ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["stories260K", "synth-llama-f32", "synth-qwen2-f32",
                                   "synth-llama3rope-f32"])
def test_imatrix_lowers_kl_divergence(tmp_path, texts, stories, model):
    """Q4_K (llama-quantize's Q4_K_M) with an importance matrix from the calibration half is
    closer to the F32 model on held-back stories than without one. (stories260K's rows of 64
    fall back to Q5_0, whose weighted quantizer the matrix drives.)"""
    f32 = shared_path(f"models/{model}.gguf")
    im = str(tmp_path / "im.gguf")
    run("imatrix", f32, "-f", texts[0], "-o", im, "-c", "64", "-q")
    plain, weighted = str(tmp_path / "plain.gguf"), str(tmp_path / "weighted.gguf")
    run("quantize", "-q", f32, plain, "Q4_K")
    run("quantize", "-q", "--imatrix", im, f32, weighted, "Q4_K")
    without, with_im = kl(plain, f32, stories), kl(weighted, f32, stories)
    print(f"{model} Q4_K: KL without imatrix {without:.5f}, with {with_im:.5f}")
    assert with_im < without


@pytest.mark.parametrize("model", ["synth-llama-f32", "synth-qwen2-f32"])
@pytest.mark.parametrize("recipe", ["Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q4_0"])
def test_target_bpw_beats_the_recipe_of_its_size(tmp_path, texts, stories, model, recipe):
    """--target-bpw at a fixed recipe's bits per weight, each tensor's sensitivity measured on the
    calibration half, makes a file no larger than the recipe's, closer to the F32 model on
    held-back stories."""
    f32 = shared_path(f"models/{model}.gguf")
    fixed, budget = str(tmp_path / "fixed.gguf"), str(tmp_path / "budget.gguf")
    err = run("quantize", "-q", f32, fixed, recipe).stderr
    bpw = re.search(r"([0-9.]+) bits per weight", err).group(1)
    err = run("quantize", "-q", "--target-bpw", bpw, "-f", texts[0], f32, budget, recipe).stderr
    assert float(re.search(r"([0-9.]+) bits per weight", err).group(1)) <= float(bpw)
    assert os.path.getsize(budget) <= os.path.getsize(fixed)
    k_fixed, k_budget = kl(fixed, f32, stories), kl(budget, f32, stories)
    print(f"{model} at {bpw} bpw: {recipe} KL {k_fixed:.5f}, budget {k_budget:.5f}")
    assert k_budget < k_fixed


def test_report(tmp_path, texts):
    f32 = shared_path("models/synth-llama-f32.gguf")
    im = str(tmp_path / "im.gguf")
    run("imatrix", f32, "-f", texts[0], "-o", im, "-c", "64", "-q")
    out = run("quantize", "-q", "--report", "--dry-run", "--imatrix", im, f32, "Q4_K_M").stdout
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["tensor", "type"] and "output err" in lines[0]
    rows = [line.split() for line in lines[1:-1]]
    assert len(rows) == 21
    # Worst first, by the output error where there is one (the layers' 14 matrices), else the
    # weights' error; the norms (not quantized) last.
    keys = [float(r[-1]) for r in rows if r[-1] != "-"]
    assert len(keys) == 16 and keys == sorted(keys, reverse=True)
    assert len([r for r in rows if len(r) == 8]) == 14
    by_name = {r[0]: r for r in rows}
    assert by_name["blk.1.attn_v.weight"][1] == "Q6_K"
    assert by_name["output.weight"][1] == "Q6_K" and len(by_name["output.weight"]) == 7
    assert re.match(r"Q4_K_M: 4\.9240 bits per weight", lines[-1]), lines[-1]
    # Without an imatrix: the weights' error only.
    out = run("quantize", "-q", "--report", "--dry-run", f32, "Q8_0").stdout
    assert "output err" not in out.splitlines()[0]


def test_cli_errors(tmp_path):
    f32 = shared_path("models/synth-llama-f32.gguf")
    out = str(tmp_path / "x.gguf")
    p = run("quantize", f32, out, "Q3_K_M", check=False)
    assert p.returncode == 2 and "unknown type 'Q3_K_M'" in p.stderr
    p = run("quantize", "--tensor-type", "attn_v", f32, out, "Q4_0", check=False)
    assert p.returncode == 2 and "PATTERN=TYPE" in p.stderr
    p = run("quantize", "--tensor-type", "(attn=q4_0", f32, out, "Q4_0", check=False)
    assert p.returncode == 2
    p = run("quantize", shared_path("models/synth-llama-q8_0.gguf"), out, "Q4_0", check=False)
    assert p.returncode == 1 and "requantizing from type Q8_0 is disabled" in p.stderr
    p = run("quantize", "--target-bpw", "2.5", f32, out, "Q4_0", check=False)
    assert p.returncode == 1 and "smallest file" in p.stderr
    p = run("quantize", "-f", f32, f32, out, "Q4_0", check=False)
    assert p.returncode == 2 and "--calibration is for --target-bpw" in p.stderr
    p = run("quantize", "--target-bpw", "5", "-f", str(tmp_path / "none.txt"), f32, out, "Q4_0",
            check=False)
    assert p.returncode == 1 and "none.txt" in p.stderr
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time")
    p = run("quantize", "--target-bpw", "5", "-f", str(short), f32, out, "Q4_0", check=False)
    assert p.returncode == 1 and "needs at least 16" in p.stderr, p.stderr
    assert not os.path.exists(out)


def test_merge_type_then_kl(tmp_path, texts):
    """`corral merge --type q4_0` (merge in f32, quantize once) is closer to llama.cpp's F32
    merge than merging into the Q4_0 base."""
    adapter = shared_path("lora/stories260K-lora-r8.gguf")
    once, twice = str(tmp_path / "once.gguf"), str(tmp_path / "twice.gguf")
    err = run("merge", shared_path("models/stories260K.gguf"), "--lora", adapter, "--type",
              "q4_0", "-o", once).stderr
    assert "quantized to Q4_0" in err
    run("merge", shared_path("models/stories260K-q4_0.gguf"), "--lora", adapter, "-o", twice)
    ref = shared_path("lora/stories260K-lora-r8-merged-f32.gguf")
    sample = shared_path("reference/tinystories-sample.txt")
    assert kl(once, ref, sample, 128) < kl(twice, ref, sample, 128)
    p = run("merge", shared_path("models/stories260K-q4_0.gguf"), "--lora", adapter, "--type",
            "q4_k_m", "-o", str(tmp_path / "no.gguf"), check=False)
    assert p.returncode == 1 and "full-precision" in p.stderr


# ---- the daemon's quantize: entries -----------------------------------------------------------

def greedy_ids(c: Client, model: str, prompt: str, n: int) -> list[int]:
    s = c.generate(model, prompt, temperature=0.0, max_tokens=n, stream=True)
    return [t for k in s for t in k.token_ids]


def test_daemon_quantize_entry(start_corrald, tmp_path):
    """A model entry with `quantize: q4_k_m` serves `path` quantized: the file is made once in
    cache.dir (with progress in the log), its tensors are `corral quantize`'s, and the next
    daemon on the same cache maps it without quantizing again."""
    cache = str(tmp_path / "cache")
    f32 = shared_path("models/synth-llama-f32.gguf")
    body = (f"cache: {{dir: {cache}}}\n"
            "models:\n"
            f"  - name: q\n    path: {f32}\n    quantize: q4_k_m\n    context: 128\n"
            f"  - name: lora-q\n    path: {shared_path('models/stories260K.gguf')}\n"
            "    quantize: q8_0\n    context: 128\n"
            f"    adapters:\n      - {{path: {shared_path('lora/stories260K-lora-r8.gguf')}}}\n")
    daemon = start_corrald(body)
    with Client(daemon.endpoint, timeout=60) as c:
        got = greedy_ids(c, "q", "Once upon a time", 8)
        assert len(got) == 8
        assert len(greedy_ids(c, "lora-q", "Once", 4)) == 4
        st = {m.name: m for m in c.status().models}
        assert st["q"].merges == 1 and st["lora-q"].merges == 1
    images = sorted(f for f in os.listdir(cache) if f.startswith("quant-"))
    assert len(images) == 2, os.listdir(cache)
    plain = str(tmp_path / "plain.gguf")
    run("quantize", "-q", f32, plain, "Q4_K_M")
    made = [os.path.join(cache, f) for f in images
            if read_gguf(os.path.join(cache, f))[0].get("corral.lora.base") == f32]
    assert len(made) == 1
    kv, _ = read_gguf(made[0])
    assert kv["corral.quantize.type"] == "Q4_K_M" and kv["general.file_type"] == 15
    same_tensors(made[0], plain)
    assert "quantizing a model variant" in daemon.log()
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=10) == 0
    again = start_corrald(body)
    with Client(again.endpoint, timeout=60) as c:
        assert greedy_ids(c, "q", "Once upon a time", 8) == got
        assert {m.name: m for m in c.status().models}["q"].merges == 0


def test_daemon_rejects_unknown_quantize_type(tmp_path):
    from test_policies import start_expecting_failure

    out = start_expecting_failure(
        "models:\n"
        f"  - name: q\n    path: {shared_path('models/synth-llama-f32.gguf')}\n"
        "    quantize: q3_k_m\n")
    assert "quantize: 'q3_k_m' is not one of" in out, out
