"""pytest fixtures for corral's Python client tests: a real corrald on a private ipc endpoint.

The Makefile runs pytest with CORRALD (the daemon binary) and CORRAL_SHARED_DIR set, and
PYTHONPATH covering clients/python and the build's generated protocol module.

Fixtures:
- ``corrald``: a daemon with no models; a test marked ``@pytest.mark.corrald_config(BODY)``
  gets BODY (YAML) appended to its config.
- ``stories``: a daemon serving ``stories`` (stories260K.gguf) and ``stories-q4`` (its Q4_0
  file), both with context 512 (:func:`stories_config`).
- ``start_corrald``: a factory, ``start_corrald(body) -> Daemon``, for tests that need several
  daemons or their own config; every daemon it started is stopped after the test.

Every daemon is stopped with SIGTERM after its test and must exit 0 within 5 s. A watchdog kills
a daemon still running WATCHDOG_S seconds after its start, so a call the daemon never answers
makes the test fail (the client's timeout fires) instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import pytest

from corral import Client, CorralError, PermissionDenied

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds a test may keep one daemon before the watchdog kills it.
WATCHDOG_S = float(os.environ.get("CORRAL_TEST_WATCHDOG_S", "30"))


def shared_path(relative: str) -> str:
    """Absolute path of a file of the shared test data ($CORRAL_SHARED_DIR, else ../shared)."""
    base = os.environ.get("CORRAL_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
    path = os.path.abspath(os.path.join(base, relative))
    if not os.path.exists(path):
        pytest.fail(f"missing shared test file {path} (set CORRAL_SHARED_DIR)")
    return path


def read_shared_text(relative: str) -> str:
    """A shared reference file's exact content, decoded as UTF-8 (no newline translation)."""
    with open(shared_path(relative), "rb") as f:
        return f.read().decode("utf-8")


def read_shared_ids(relative: str) -> list[int]:
    """A whitespace-separated list of token ids from the shared reference data."""
    return [int(x) for x in read_shared_text(relative).split()]


def stories_config() -> str:
    """Config body serving ``stories`` (stories260K.gguf) and ``stories-q4`` (its Q4_0 file), both
    with a context of 512 tokens."""
    return (
        "models:\n"
        "  - name: stories\n"
        f"    path: {shared_path('models/stories260K.gguf')}\n"
        "    context: 512\n"
        "  - name: stories-q4\n"
        f"    path: {shared_path('models/stories260K-q4_0.gguf')}\n"
        "    context: 512\n"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "corrald_config(body): YAML appended to the `corrald` fixture's config"
    )


@dataclass
class Daemon:
    """A running corrald of one test."""

    endpoint: str
    process: subprocess.Popen
    log_path: str
    config_path: str
    watchdog_fired: threading.Event = field(default_factory=threading.Event)

    def log(self) -> str:
        """Everything the daemon wrote to stdout and stderr so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def corrald_path() -> str:
    path = os.environ.get("CORRALD")
    if not path:
        pytest.fail("CORRALD is not set: run the Python tests through `make test`")
    return path


@contextmanager
def running_corrald(body: str = "", extra_args: Sequence[str] = ()) -> Iterator[Daemon]:
    """Start corrald with ``body`` (YAML; a `listen:` with a private endpoint is added unless the
    body has one; ``$IPC`` in the body stands for that endpoint, for a `listen:` that names it
    beside others), wait until it answers a ping, and stop it afterwards."""
    with tempfile.TemporaryDirectory(prefix="corral-py-") as tmp:
        endpoint = f"ipc://{tmp}/sock/corral.sock"
        config = os.path.join(tmp, "corral.yaml")
        names_own = "$IPC" in body
        body = body.replace("$IPC", endpoint)
        own_listen = names_own or not any(
            line.startswith("listen:") for line in body.splitlines()
        )
        with open(config, "w", encoding="utf-8") as f:
            if own_listen and not names_own:
                f.write(f'listen: ["{endpoint}"]\n')
            # A private swap directory: sessions swapped out at shutdown must not leak into other
            # tests' daemons through the user's default folders.
            if not any(line.startswith("memory:") for line in body.splitlines()):
                f.write(f'memory: {{swap_dir: "{tmp}/swap"}}\n')
            # Likewise the cache of merged and rearranged weights (cache.dir).
            if not any(line.startswith("cache:") for line in body.splitlines()):
                f.write(f'cache: {{dir: "{tmp}/cache"}}\n')
            f.write(body)
        log_path = os.path.join(tmp, "corrald.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [corrald_path(), "-c", config, *extra_args], stdout=log, stderr=log
            )
        daemon = Daemon(endpoint, proc, log_path, config)
        deadline = time.monotonic() + 10
        # Connecting before the socket exists costs a ZeroMQ reconnect interval: wait for it.
        socket_path = endpoint[len("ipc://") :]
        while own_listen and not os.path.exists(socket_path) and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        with Client(endpoint, timeout=0.2) as c:
            while True:
                try:
                    c.ping()
                    break
                except PermissionDenied:
                    break  # a daemon whose config refuses this user is up too
                except CorralError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        pytest.fail(f"corrald did not start:\n{daemon.log()}")

        def watchdog() -> None:
            if proc.poll() is None:
                daemon.watchdog_fired.set()
                proc.kill()

        timer = threading.Timer(WATCHDOG_S, watchdog)
        timer.daemon = True
        timer.start()
        try:
            yield daemon
        finally:
            timer.cancel()
            if daemon.watchdog_fired.is_set():
                proc.wait()
                pytest.fail(
                    f"the watchdog killed corrald after {WATCHDOG_S:g} s (a call hung?):\n"
                    f"{daemon.log()}"
                )
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"corrald did not stop within 5 s of SIGTERM:\n{daemon.log()}")
            assert code == 0, f"corrald exited {code}:\n{daemon.log()}"


@pytest.fixture
def corrald(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    marker = request.node.get_closest_marker("corrald_config")
    body = marker.args[0] if marker else ""
    with running_corrald(body) as daemon:
        yield daemon


@pytest.fixture
def stories() -> Iterator[Daemon]:
    with running_corrald(stories_config()) as daemon:
        yield daemon


@pytest.fixture
def start_corrald() -> Iterator[Callable[..., Daemon]]:
    with ExitStack() as stack:

        def start(body: str = "", extra_args: Sequence[str] = ()) -> Daemon:
            return stack.enter_context(running_corrald(body, extra_args))

        yield start
