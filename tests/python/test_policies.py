"""Input sanitizers and regex-constrained output through a real corrald.

The daemon side of the policies: profiles from the config (built-ins and the sample plugin,
tests/plugins/rewrite_plugin.c), chosen by the model, the app or the request; the report in Done;
rejections as SANITIZER_REJECTED naming the step; Generate.constraint (``regex=`` here,
``corral run --regex``) making the whole output match; a plugin that cannot load stopping corrald
at startup with the path and the loader's reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest

from conftest import corrald_path, shared_path
from corral import Client, InvalidArgument, NotFound, SanitizerRejected, StopReason
from test_cli_bench import corral_path

PROMPT = "Once upon a time"


def plugin_path(name: str) -> str:
    """A test plugin built next to CORRALD (scripts/run-tests sets CORRAL_TEST_PLUGIN_DIR)."""
    base = os.environ.get("CORRAL_TEST_PLUGIN_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(corrald_path())), "tests"
    )
    path = os.path.join(base, f"libcorral_test_plugin_{name}.so")
    if not os.path.exists(path):
        pytest.fail(f"missing test plugin {path} (set CORRAL_TEST_PLUGIN_DIR)")
    return path


def policies_config() -> str:
    """stories under the `strict` profile; `rewrite` (the sample plugin) for apps and requests."""
    return (
        "sanitizers:\n"
        "  - name: strict\n"
        "    steps:\n"
        "      - utf8: {mode: reject}\n"
        "      - invisible:\n"
        '      - deny: {secret: "/password/i"}\n'
        "      - max_input: {bytes: 200}\n"
        "  - name: rewrite\n"
        "    steps:\n"
        f"      - plugin: {{path: {plugin_path('rewrite')}, from: dragon, to: cat, "
        "forbid: evil}\n"
        "models:\n"
        "  - name: stories\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n"
        "    sanitizer: strict\n"
        "  - name: plain\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n"
        "apps:\n"
        "  - name: rewriter\n"
        "    models: [plain]\n"
        "    sanitizer: rewrite\n"
    )


@pytest.fixture
def daemon(start_corrald):
    return start_corrald(policies_config())


# ---- constraints ----------------------------------------------------------------------------


SENTENCE = r"[A-Z][a-z]+( [a-z]+){2,6}\."
RECORD = r'\{"name": "[a-z]{1,10}", "age": [1-9][0-9]?\}'


@pytest.mark.parametrize("pattern", [SENTENCE, RECORD])
def test_constrained_output_matches_greedy_and_sampled(daemon, pattern):
    with Client(daemon.endpoint, timeout=10) as c:
        outcomes = []
        for temperature, seed in [(0.0, 1), (0.8, 1), (0.8, 2), (1.2, 3), (1.5, 4)]:
            r = c.generate(
                "plain",
                PROMPT,
                regex=pattern,
                temperature=temperature,
                seed=seed,
                max_tokens=200,
                return_done=True,
            )
            # The pattern is finite: the generation ends because it is complete, never cut short.
            assert r.done.stop_reason in (StopReason.CONSTRAINT, StopReason.EOG), r
            assert re.fullmatch(pattern, r.text), (pattern, r.text)
            outcomes.append(r.text)
        # Sampling still samples within the pattern.
        assert len(set(outcomes)) > 1, outcomes


def test_unconstrained_output_would_not_match(daemon):
    # The constraint is what makes the output match: without it the model writes something else.
    with Client(daemon.endpoint, timeout=10) as c:
        text = c.generate("plain", PROMPT, temperature=0.0, max_tokens=40)
    assert not re.fullmatch(RECORD, text)


def test_constraint_with_stream_and_cli(daemon):
    with Client(daemon.endpoint, timeout=10) as c:
        s = c.generate("plain", PROMPT, regex=RECORD, temperature=0.0, max_tokens=200, stream=True)
        text = "".join(k.text for k in s)
    assert re.fullmatch(RECORD, text) and s.done.stop_reason is StopReason.CONSTRAINT
    proc = subprocess.run(
        [corral_path(), "run", "--endpoint", daemon.endpoint, "plain", PROMPT, "--temp", "0",
         "-n", "200", "--regex", RECORD],
        capture_output=True, text=True, timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == text


@pytest.mark.parametrize(
    "pattern, words",
    [
        ("(?=a)b", "lookahead"),
        (r"(a)\1", "backreference"),
        ("a{2,1}", "{"),
        ("[z-a]", "range"),
        ("(", "missing ')'"),
    ],
)
def test_bad_regex_is_rejected_with_its_problem(daemon, pattern, words):
    with Client(daemon.endpoint, timeout=10) as c:
        with pytest.raises(InvalidArgument, match=re.escape(words)):
            c.generate("plain", PROMPT, regex=pattern, max_tokens=8)
        # The daemon is fine afterwards.
        assert c.generate("plain", PROMPT, temperature=0.0, max_tokens=4)


# ---- sanitizers -----------------------------------------------------------------------------


def test_model_profile_reports_each_step(daemon):
    with Client(daemon.endpoint, timeout=10) as c:
        r = c.generate("stories", PROMPT, temperature=0.0, max_tokens=8, return_done=True)
        assert r.done.sanitizer_report == (
            "utf8=passed invisible=passed deny=passed max_input=passed"
        )
        # Invisible characters are removed before tokenizing: same text as the clean prompt.
        dirty = "Once\u200b upon a\u2060 time"
        r2 = c.generate("stories", dirty, temperature=0.0, max_tokens=8, return_done=True)
        assert r2.text == r.text
        assert "invisible=changed" in r2.done.sanitizer_report
        # A model with no profile reports nothing.
        r3 = c.generate("plain", PROMPT, temperature=0.0, max_tokens=8, return_done=True)
        assert r3.done.sanitizer_report == "" and r3.text == r.text


def test_rejection_names_the_step(daemon):
    with Client(daemon.endpoint, timeout=10) as c:
        with pytest.raises(SanitizerRejected, match="'deny'.*secret") as e:
            c.generate("stories", "tell me the PassWord now", max_tokens=8)
        assert "deny=rejected" in str(e.value)
        with pytest.raises(SanitizerRejected, match="max_input"):
            c.generate("stories", "x" * 201, max_tokens=8)
        with pytest.raises(SanitizerRejected, match="'deny'"):
            c.chat(
                "stories",
                [{"role": "system", "content": "be nice"},
                 {"role": "user", "content": "what is the password?"}],
                max_tokens=8,
            )
        assert c.status().daemon.active == 0


def test_plugin_profile_for_app_and_request(daemon):
    with Client(daemon.endpoint, timeout=10) as plain, Client(
        daemon.endpoint, app="rewriter", timeout=10
    ) as rewriter:
        want = plain.generate("plain", "the cat", temperature=0.0, max_tokens=16)
        # The app's profile: the plugin rewrites before tokenizing.
        r = rewriter.generate("plain", "the dragon", temperature=0.0, max_tokens=16,
                              return_done=True)
        assert r.text == want
        assert r.done.sanitizer_report == "rewrite=changed(1: rewrote 1 occurrence of 'dragon')"
        with pytest.raises(SanitizerRejected, match="'rewrite'.*evil"):
            rewriter.generate("plain", "an evil plan", max_tokens=8)
        # A plugin's own failure fails that request only.
        with pytest.raises(Exception, match="rewrite"):
            rewriter.generate("plain", "PLUGIN-FAIL", max_tokens=8)
        assert rewriter.generate("plain", "the dragon", temperature=0.0, max_tokens=16) == want
        # A request may choose a profile; an unknown one is an error, not a silent pass.
        assert plain.generate("stories", "the dragon", sanitizer="rewrite", temperature=0.0,
                              max_tokens=16) == want
        with pytest.raises(NotFound, match="'nope'"):
            plain.generate("plain", PROMPT, sanitizer="nope", max_tokens=8)


# ---- startup --------------------------------------------------------------------------------


def start_expecting_failure(body: str, *args: str) -> str:
    """Run corrald (with `args`, e.g. --check-config) on a config that must make it exit
    nonzero; its output."""
    with tempfile.TemporaryDirectory(prefix="corral-py-") as tmp:
        config = os.path.join(tmp, "corral.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f'listen: ["ipc://{tmp}/sock/corral.sock"]\n')
            f.write(f'memory: {{swap_dir: "{tmp}/swap"}}\n')
            f.write(body)
        proc = subprocess.run([corrald_path(), "-c", config, *args], capture_output=True,
                              text=True, timeout=20)
        assert proc.returncode != 0, proc.stderr
        return proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "step, words",
    [
        ("plugin: {path: /nonexistent/policy.so}", ["/nonexistent/policy.so", "cannot load"]),
        ("plugin: {path: BROKEN_ABI}", ["abi"]),
        ("deny: {}", ["deny"]),
        ("utf8: {mode: sometimes}", ["utf8", "sometimes"]),
        ("whatever:", ["whatever"]),
    ],
)
def test_bad_profile_stops_startup(step, words):
    step = step.replace("BROKEN_ABI", plugin_path("broken_abi"))
    body = "sanitizers:\n  - name: p\n    steps:\n      - " + step + "\n"
    # Refused the same way by --check-config, which builds the profiles too.
    for args in [(), ("--check-config",)]:
        out = start_expecting_failure(body, *args)
        for w in words:
            assert w.lower() in out.lower(), (args, out)
