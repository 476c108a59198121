"""Structured output through a real corrald: Generate.json_schema (``json_schema=`` here,
``corral run --json-schema``) makes the output a JSON document the schema validates.

Every schema of tests/schemas (the ones tests/bench/constraint --schema measures) is generated
from on two real models of ../shared — stories260K (a trained TinyStories model) and a synthetic
llama with the same vocabulary (random weights: it writes anything the constraint allows) — at
several temperatures and seeds. Each output that ended because it was complete (end of
generation, or the constraint finished) must parse and validate with the jsonschema package
(Debian's python3-jsonschema), formats included; an output cut by max_tokens must say so
(StopReason.MAX_TOKENS) and is not validated. Then refusals (a JSON pointer to the part at fault),
json_object mode, streaming and the CLI.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import subprocess

import jsonschema
import pytest

from conftest import ROOT, shared_path
from corral import Client, InvalidArgument, StopReason
from test_cli_bench import corral_path

PROMPT = "Once upon a time"
SCHEMA_DIR = os.path.join(ROOT, "tests", "schemas")
SCHEMAS = sorted(glob.glob(os.path.join(SCHEMA_DIR, "*.json")))
MODELS = ["stories", "synth"]
# (temperature, seed): greedy, and sampling from tame to wild.
SETTINGS = [(0.0, 1), (0.5, 10), (0.7, 11), (0.9, 12), (1.0, 13), (1.0, 14), (1.2, 15), (1.5, 16)]
MAX_TOKENS = 400  # of a 512-token context


def schema_config() -> str:
    return (
        "models:\n"
        "  - name: stories\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n"
        "  - name: synth\n"
        f"    path: {shared_path('models/synth-llama-q8_0.gguf')}\n"
        "    context: 512\n"
    )


@pytest.fixture(scope="module")
def daemon():
    # One daemon for the module: the models load once and the compiled schemas stay cached.
    from conftest import running_corrald

    with running_corrald(schema_config()) as d:
        yield d


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# Formats as a strict validator sees them. jsonschema checks date, email, uuid and ipv4 itself;
# its time and date-time checks need a package Debian does not ship, so they are added here.
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition("T")
    return bool(sep) and _date(date) and _time(time)


@FORMATS.checks("time", raises=ValueError)
def _time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    # RFC 3339 full-time: an offset is required.
    if not (value.endswith("Z") or value[-6:-5] in ("+", "-")):
        raise ValueError(f"no offset in {value!r}")
    datetime.time.fromisoformat(value.replace("Z", "+00:00"))
    return True


def _date(value: str) -> bool:
    datetime.date.fromisoformat(value)
    return len(value) == 10


def validator(schema: dict) -> jsonschema.protocols.Validator:
    if schema == {"type": "json_object"}:  # not JSON Schema: OpenAI's "any object"
        schema = {"type": "object"}
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=FORMATS)


@pytest.mark.parametrize("path", SCHEMAS, ids=[os.path.basename(p)[:-5] for p in SCHEMAS])
def test_outputs_validate(daemon, path):
    schema = load(path)
    check = validator(schema)
    complete = cut = 0
    with Client(daemon.endpoint, timeout=60) as c:
        for model in MODELS:
            for temperature, seed in SETTINGS:
                r = c.generate(
                    model,
                    PROMPT,
                    json_schema=schema,
                    temperature=temperature,
                    seed=seed,
                    max_tokens=MAX_TOKENS,
                    return_done=True,
                )
                if r.done.stop_reason is StopReason.MAX_TOKENS:
                    # Cut short (a small model can wander inside a string): said, not validated.
                    assert r.done.generated_tokens == MAX_TOKENS, r.done
                    cut += 1
                    continue
                assert r.done.stop_reason in (StopReason.EOG, StopReason.CONSTRAINT), r
                doc = json.loads(r.text)
                errors = [e.message for e in check.iter_errors(doc)]
                assert not errors, (model, temperature, seed, r.text, errors)
                complete += 1
    # The test only proves something if enough outputs finished.
    assert complete >= 4, f"{complete} complete, {cut} cut by max_tokens"


def test_cut_output_says_max_tokens(daemon):
    # Too few tokens for the document: the stop reason says so, and the text is a prefix.
    schema = load(os.path.join(SCHEMA_DIR, "person.json"))
    with Client(daemon.endpoint, timeout=30) as c:
        r = c.generate(
            "stories", PROMPT, json_schema=schema, temperature=0.0, max_tokens=3, return_done=True
        )
    assert r.done.stop_reason is StopReason.MAX_TOKENS
    assert r.text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


def test_json_object_mode_and_text_schema(daemon):
    with Client(daemon.endpoint, timeout=30) as c:
        for seed in (1, 2, 3):
            r = c.generate(
                "synth",
                PROMPT,
                json_schema={"type": "json_object"},
                temperature=1.0,
                seed=seed,
                max_tokens=MAX_TOKENS,
                return_done=True,
            )
            if r.done.stop_reason is not StopReason.MAX_TOKENS:
                assert isinstance(json.loads(r.text), dict), r.text
        # The schema as JSON text, with a bounded integer: greedy, so the same text twice.
        text = '{"type": "integer", "minimum": 10, "maximum": 99}'
        a = c.generate("stories", PROMPT, json_schema=text, temperature=0.0, max_tokens=8)
        b = c.generate("stories", PROMPT, json_schema=json.loads(text), temperature=0.0,
                       max_tokens=8)
    assert a == b and 10 <= int(a) <= 99


def test_streamed_and_cli_output_agree(daemon, tmp_path):
    path = os.path.join(SCHEMA_DIR, "order.json")
    schema = load(path)
    with Client(daemon.endpoint, timeout=30) as c:
        s = c.generate(
            "synth", PROMPT, json_schema=schema, temperature=0.0, max_tokens=MAX_TOKENS,
            stream=True,
        )
        text = "".join(k.text for k in s)
    assert s.done.stop_reason in (StopReason.EOG, StopReason.CONSTRAINT), s.done
    assert not list(validator(schema).iter_errors(json.loads(text)))
    proc = subprocess.run(
        [corral_path(), "run", "--endpoint", daemon.endpoint, "synth", PROMPT, "--temp", "0",
         "-n", str(MAX_TOKENS), "--json-schema", path],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == text
    # The schema from stdin, the prompt as an argument.
    with open(path, encoding="utf-8") as f:
        proc = subprocess.run(
            [corral_path(), "run", "--endpoint", daemon.endpoint, "synth", PROMPT, "--temp",
             "0", "-n", str(MAX_TOKENS), "--json-schema", "-"],
            stdin=f, capture_output=True, text=True, timeout=30,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == text
    # A bad schema file: the daemon's message, naming the place.
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}')
    proc = subprocess.run(
        [corral_path(), "run", "--endpoint", daemon.endpoint, "stories", PROMPT,
         "--json-schema", str(bad)],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0
    assert "#/properties/n/multipleOf: multipleOf is not supported" in proc.stderr


def test_run_local_json_schema():
    # The engine's local tool compiles the same schema the same way (no daemon involved).
    path = os.path.join(SCHEMA_DIR, "order.json")
    proc = subprocess.run(
        [corral_path(), "run-local", shared_path("models/synth-llama-q8_0.gguf"), "-p", PROMPT,
         "--temp", "0", "-n", str(MAX_TOKENS), "--json-schema", path],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "stop: constraint" in proc.stderr or "stop: eog" in proc.stderr, proc.stderr
    assert proc.stdout.startswith(PROMPT)
    doc = json.loads(proc.stdout[len(PROMPT):])
    assert not list(validator(load(path)).iter_errors(doc))
    proc = subprocess.run(
        [corral_path(), "run-local", shared_path("models/synth-llama-q8_0.gguf"), "-p", PROMPT,
         "--regex", "a", "--json-schema", path],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "cannot be used together" in proc.stderr


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 5}}},
         "json schema: #/properties/age/multipleOf: multipleOf is not supported"),
        ({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
          "$ref": "#/$defs/node"},
         "#/$defs/node/properties/next/$ref: recursive $ref '#/$defs/node' is not supported"),
        ({"type": "string", "format": "hostname"}, "#/format: format 'hostname' is not supported"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]},
         "#/oneOf: branches 0 and 1 overlap: both accept 0"),
        ({"type": "string", "pattern": "(?<=a)b"}, "#/pattern: regex: lookbehind"),
        ('{"type": ', "json schema: not valid JSON: line 1"),
    ],
)
def test_unsupported_schema_is_refused_by_place(daemon, schema, words):
    with Client(daemon.endpoint, timeout=10) as c:
        with pytest.raises(InvalidArgument) as e:
            c.generate("stories", PROMPT, json_schema=schema, max_tokens=8)
        assert words in str(e.value)
        # The daemon is fine afterwards.
        assert c.generate("stories", PROMPT, temperature=0.0, max_tokens=4)


def test_regex_and_schema_together_are_refused(daemon):
    with Client(daemon.endpoint, timeout=10) as c:
        with pytest.raises(InvalidArgument, match="constraint .* and json_schema cannot be used"):
            c.generate("stories", PROMPT, regex="[a-z]+", json_schema={"type": "string"})


def test_client_checks_the_schema_type():
    from corral import _codec

    with pytest.raises(TypeError, match="json_schema must be"):
        _codec.json_schema_text(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not JSON"):
        _codec.json_schema_text({"a": float("nan")})
    assert _codec.json_schema_text({"const": "é"}) == '{"const": "é"}'
