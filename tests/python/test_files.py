"""A model file that breaks under a running corrald, as the clients see it: the request fails with
an error naming the file, Status (Python client and ``corral ps``) shows the model BROKEN with the
reason, the other models serve, and the model serves again once its file is whole.

(The failure modes themselves — SIGBUS under a running request, on pool threads, rewritten and
replaced files, injected I/O errors, kill -9 — are exercised by ctest's integration.files in
both builds.)
"""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import shared_path
from corral import Client, CorralError
from test_cli_bench import corral_path

PROMPT = "Once upon a time"


def test_broken_model_in_status_and_ps(start_corrald, tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copyfile(shared_path("models/stories260K.gguf"), model)
    d = start_corrald(
        "models:\n"
        f"  - name: m\n    path: {model}\n    context: 256\n"
        f"  - name: other\n    path: {shared_path('models/stories260K-q4_0.gguf')}\n"
        "    context: 256\n"
    )
    with Client(d.endpoint, timeout=30) as c:
        before = c.generate("m", PROMPT, max_tokens=16, temperature=0.0)
        with open(model, "r+b") as f:  # cut in half, in place
            f.truncate(model.stat().st_size // 2)
        try:
            c.generate("m", PROMPT, max_tokens=16, temperature=0.0)
            raise AssertionError("a truncated model file served a request")
        except CorralError as e:
            assert str(model) in e.message and "past end of file" in e.message, e.message
        status = {s.name: s for s in c.status().models}
        assert status["m"].state.name == "BROKEN"
        assert str(model) in status["m"].error
        assert status["other"].state.name != "BROKEN" and status["other"].error == ""
        assert c.generate("other", PROMPT, max_tokens=8, temperature=0.0)

        ps = subprocess.run([corral_path(), "--endpoint", d.endpoint, "ps"], capture_output=True,
                            text=True, timeout=30, check=True).stdout
        assert "broken" in ps and f"m: {status['m'].error}" in ps, ps
        js = json.loads(subprocess.run([corral_path(), "--endpoint", d.endpoint, "ps", "--json"],
                                       capture_output=True, text=True, timeout=30,
                                       check=True).stdout)
        m = {x["name"]: x for x in js["models"]}["m"]
        assert m["state"] == "broken" and m["error"] == status["m"].error

        shutil.copyfile(shared_path("models/stories260K.gguf"), model)
        assert c.generate("m", PROMPT, max_tokens=16, temperature=0.0) == before
        status = {s.name: s for s in c.status().models}
        assert status["m"].state.name == "RESIDENT" and status["m"].error == ""
    assert "model broken" in d.log()
