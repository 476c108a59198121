"""pytest fixtures for corral's Python client tests: a real corrald on a private ipc endpoint.

The Makefile runs pytest with CORRALD (the daemon binary) set and PYTHONPATH covering
clients/python and the build's generated protocol module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

import pytest

from corral import Client, CorralError


@dataclass
class Daemon:
    endpoint: str
    process: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def corrald_path() -> str:
    path = os.environ.get("CORRALD")
    if not path:
        pytest.fail("CORRALD is not set: run the Python tests through `make test`")
    return path


@pytest.fixture
def corrald() -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="corral-py-") as tmp:
        endpoint = f"ipc://{tmp}/sock/corral.sock"
        config = os.path.join(tmp, "corral.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f'listen: ["{endpoint}"]\n')
        log_path = os.path.join(tmp, "corrald.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([corrald_path(), "-c", config], stdout=log, stderr=log)
        daemon = Daemon(endpoint, proc, log_path)
        deadline = time.monotonic() + 10
        with Client(endpoint, timeout=0.2) as c:
            while True:
                try:
                    c.ping()
                    break
                except CorralError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        proc.kill()
                        pytest.fail(f"corrald did not start:\n{daemon.log()}")
        try:
            yield daemon
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail("corrald did not stop within 5 s of SIGTERM")
            assert code == 0, f"corrald exited {code}:\n{daemon.log()}"
