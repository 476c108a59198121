"""A new user's first hour (issue 20, part A), as scripted checks: `make run` on a terminal (Ctrl-C
exits 0, the next command is printed, only corrald and corral are built), the local tools' cache in
the user's own folder, option errors prefixed as the rest, and README.md as a user document whose
links, template names and sanitizer steps are real. The install itself is ctest's
integration.install (tests/install/check-install)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import stat
import subprocess
import time

import pytest

from conftest import ROOT, shared_path

CORRAL = os.environ.get("CORRAL", os.path.join(ROOT, "build", "clients", "cli", "corral"))
CORRALD = os.environ.get("CORRALD", os.path.join(ROOT, "build", "daemon", "corrald"))
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(CORRALD)))


def read(relative: str) -> str:
    with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
        return f.read()


# ---- make run ---------------------------------------------------------------------------------


def run_on_terminal(argv: list[str], cwd: str, until: bytes, then: bytes,
                    limit_s: float = 600) -> tuple[int, str]:
    """Run argv as the foreground job of a fresh pseudo-terminal, type `then` once `until` has
    appeared, and return (exit code, everything the terminal showed). `limit_s` only bounds a
    hang: the test does not depend on how fast anything is."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the terminal as its controlling tty
        try:
            os.chdir(cwd)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    seen = b""
    typed = False
    end = time.monotonic() + limit_s
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: every process of the terminal has closed it
                break
            if not data:
                break
            seen += data
            if not typed and until in seen:
                os.write(fd, then)
                typed = True
        else:
            # A hang: end the terminal's foreground group too (corrald, in a group of its own,
            # would outlive make: the SIGHUP of the terminal's end only reloads its config).
            try:
                os.killpg(os.tcgetpgrp(fd), signal.SIGKILL)
            except OSError:
                pass
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace")


def test_make_run_ctrl_c_exits_0_and_says_what_to_try(tmp_path):
    endpoint = f"ipc://{tmp_path}/sock/corral.sock"
    config = tmp_path / "corral.yaml"
    config.write_text(
        f'listen: ["{endpoint}"]\n'
        "http: {listen: []}\n"
        f'memory: {{swap_dir: "{tmp_path}/swap"}}\n'
        f'cache: {{dir: "{tmp_path}/cache"}}\n'
        "models:\n"
        "  - name: stories\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
    )
    code, shown = run_on_terminal(
        ["make", "run", f"BUILD={BUILD}", f"CONFIG={config}", "JOBS=2"], ROOT,
        until=b"Ctrl-C stops corrald", then=b"\x03")
    # Ctrl-C reached corrald alone: it stopped cleanly, and make exited with its status.
    assert code == 0, shown
    assert "corrald stopped" in shown, shown
    hint = [line for line in shown.splitlines() if line.startswith("corral:")]
    assert any("run stories" in line and "Once upon a time" in line for line in hint), shown
    assert any(endpoint in line for line in hint), shown


def test_make_run_builds_only_what_it_runs():
    out = subprocess.run(["make", "-n", "run", f"BUILD={BUILD}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    builds = [line for line in out.stdout.splitlines() if "cmake --build" in line]
    assert builds and all("--target corrald corral" in line for line in builds), out.stdout


# ---- per-user folders -------------------------------------------------------------------------


# The local tools' arguments for a short run of the q4_0 model (which has weights to rearrange).
LOCAL_TOOLS = {
    "run-local": ["-p", "Once upon a time", "-n", "4", "--temp", "0"],
    "bench": ["-p", "8", "-n", "4", "-r", "1", "-t", "1", "--bw-mib", "16", "--no-cold"],
}


@pytest.mark.parametrize("tool", sorted(LOCAL_TOOLS))
def test_local_tools_keep_rearranged_weights_in_the_users_cache(tool, tmp_path):
    model = shared_path("models/stories260K-q4_0.gguf")
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    out = subprocess.run([CORRAL, tool, model] + LOCAL_TOOLS[tool],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "xdg-cache" / "corral"  # corrald's default cache.dir, the same folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [p.name for p in folder.glob("repack-stories260K-q4_0-*.gguf")], list(folder.iterdir())
    # 'none' keeps them in memory: nothing new is written.
    env["XDG_CACHE_HOME"] = str(tmp_path / "other")
    out = subprocess.run([CORRAL, tool, model, "--cache-dir", "none"] + LOCAL_TOOLS[tool],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "other").exists()


def test_corrald_defaults_to_the_users_folders(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(tmp_path / "home")
    out = subprocess.run([CORRALD, "--help-config"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert re.search(r"memory\.swap_dir +path +default +\$XDG_STATE_HOME/corral/swap", out.stdout)
    assert re.search(r"cache\.dir +path +default +\$XDG_CACHE_HOME/corral", out.stdout)
    assert "/var/tmp/corral" not in out.stdout


# ---- small things ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "chat", "ps", "bench", "run-local", "synth", "merge",
                                     "quantize", "logits", "keygen"])
def test_option_errors_carry_the_commands_prefix(command):
    out = subprocess.run([CORRAL, command, "--no-such-option"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith(f"corral {command}: unrecognized option"), out.stderr


def test_not_found_lists_the_configured_models(stories):
    env = dict(os.environ, CORRAL_ENDPOINT=stories.endpoint)
    out = subprocess.run([CORRAL, "run", "storeis", "Once"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "model 'storeis' is not configured; configured: stories, stories-q4" in out.stderr


def test_paths_are_shown_without_detours(start_corrald):
    models = os.path.dirname(shared_path("models/stories260K.gguf"))
    detour = os.path.join(models, "..", "models", ".", "stories260K.gguf")
    daemon = start_corrald(f"models:\n  - name: stories\n    path: {detour}\n")
    env = dict(os.environ, CORRAL_ENDPOINT=daemon.endpoint)
    out = subprocess.run([CORRAL, "models", "--json"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)["models"][0]["path"]
    assert shown == os.path.join(models, "stories260K.gguf"), shown


# ---- README.md as a user document -------------------------------------------------------------


DOCS = ["README.md", "SECURITY.md", "docs/engine.md", "docs/memory.md", "docs/performance.md",
        "docs/robustness.md", "clients/python/README.md", "adapters/README.md",
        "policies/README.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_links_point_inside_the_repository(doc):
    text = read(doc)
    assert "../shared/STYLE.md" not in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), target))
        assert path.startswith(ROOT + os.sep), f"{doc}: {target} leaves the repository"
        assert os.path.exists(path), f"{doc}: {target} does not exist"


def sections(text: str) -> dict[str, str]:
    """The README's `## ` sections by title, each with its body (up to the next `## `)."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def test_readme_is_a_user_document():
    readme = read("README.md")
    found = sections(readme)
    # What a user looks for, in the order they need it; the internals live in docs/.
    want = ["Install", "The two commands", "Quick start", "The corral command", "Running corrald",
            "Protocol", "Client libraries", "Performance", "License"]
    assert [t for t in found if t in want] == want, list(found)
    assert "### Configuration" in found["Running corrald"]
    assert "model supervisor" in readme.split("\n## ", 1)[0]  # what corral is, first
    assert "Engine" not in found
    for doc in ("docs/engine.md", "docs/memory.md", "docs/performance.md"):
        assert f"({doc})" in readme and os.path.exists(os.path.join(ROOT, doc)), doc
    # One current performance table with the commands that make it; no run-by-run history.
    perf = found["Performance"]
    assert len(re.findall(r"^\|[-|]+\|$", perf, flags=re.M)) == 1, perf
    assert "`tests/bench/run-all`" in perf and "corral bench" in perf
    assert not re.search(r"\bsteal\b|hypervisor|\b20\d\d-\d\d-\d\d\b|\b[0-9a-f]{7,40}\b", perf)


def test_readme_states_the_license_and_the_style_guide_is_here():
    readme = read("README.md")
    assert "MIT" in readme and "(LICENSE)" in readme
    assert read("LICENSE").startswith("MIT License")
    assert "(docs/STYLE.md)" in readme and os.path.exists(os.path.join(ROOT, "docs", "STYLE.md"))


def test_readme_template_names_exist():
    readme = read("README.md")
    listed = re.search(r"Chat templates \(([^)]*)\)", readme)
    assert listed, "README.md lists no chat templates"
    names = re.findall(r"`([a-z0-9-]+)`", listed.group(1))
    assert "mistral-v1" in names and "mistral" not in names
    for name in names:
        out = subprocess.run([CORRAL, "run-local", shared_path("models/stories260K.gguf"),
                              "--chat", "--template", name, "-p", "Hi", "-n", "1",
                              "--cache-dir", "none"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"template {name}: {out.stderr}"


def test_readme_shows_every_sanitizer_step():
    out = subprocess.run([CORRALD, "--help-config"], capture_output=True, text=True, timeout=60)
    steps_doc = next(
        line for line in out.stdout.splitlines() if line.strip().startswith("in order:"))
    steps = re.findall(r"(?:in order: |, )([a-z0-9_]+) [{]", steps_doc)
    assert "regex" in steps and "utf8" in steps, steps_doc
    readme = read("README.md")
    for step in steps:
        assert re.search(rf"- {step}:", readme), f"README.md's config shows no '{step}' step"


def test_readme_python_example_is_what_the_install_test_runs():
    # check-install takes the first ```python and ```c blocks: they must be whole programs.
    readme = read("README.md")
    c = readme.split("```c\n", 1)[1].split("```", 1)[0]
    assert "#include <corral.h>" in c and "int main(void)" in c
    py = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert "from corral import Client" in py and "with Client() as c:" in py
