"""Who may use corrald, from the Python clients and the CLI (SECURITY.md): CURVE keys for tcp
endpoints from arguments, files or the environment; `corral keygen`; and refusals reported as
PermissionDenied at once, not after a timeout.

The access rules themselves (models, ceilings, rates...) are tested in C against a real corrald
(tests/integration/test_access.c); here the clients' side of authentication is."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Daemon, stories_config
from corral import AsyncClient, Client, InvalidArgument, PermissionDenied
from test_cli_bench import corral_path

#: A refusal must come at once; this only bounds the wait so that a hang fails the test.
PROMPT_WAIT_S = 20.0


def keygen(directory: Path, name: str) -> str:
    """Make a key pair with the CLI; returns the public key it prints."""
    r = subprocess.run(
        [corral_path(), "keygen", str(directory), "--name", name],
        capture_output=True, text=True, check=True, timeout=30,
    )
    return r.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, object]:
    d = tmp_path / "keys"
    return {
        "dir": d,
        "server": keygen(d, "server"),
        "client": keygen(d, "client"),
        "stranger": keygen(d, "stranger"),
    }


@pytest.fixture
def tcp_daemon(start_corrald, keys) -> tuple[Daemon, str]:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    body = (
        f'listen: ["$IPC", "{endpoint}"]\n'
        f"auth: {{server_key_file: {keys['dir']}/server.key}}\n"
        + stories_config()
        + "apps:\n  - name: remote\n    models: [stories]\n"
        + f"    curve_keys: ['{keys['client']}']\n"
    )
    d = start_corrald(body)
    return d, endpoint


def test_keygen_writes_a_private_secret_and_a_public_key(tmp_path):
    d = tmp_path / "k"
    public = keygen(d, "corral")
    assert len(public) == 40
    secret_file, public_file = d / "corral.key", d / "corral.pub"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert public in public_file.read_text()
    assert public not in secret_file.read_text()
    # Never overwritten.
    r = subprocess.run([corral_path(), "keygen", str(d)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "not overwritten" in r.stderr
    assert public in public_file.read_text()


def test_curve_keys_from_arguments_files_and_environment(tcp_daemon, keys, monkeypatch):
    d, endpoint = tcp_daemon
    secret = str(keys["dir"] / "client.key")
    with Client(endpoint, server_key=keys["server"], client_key_file=secret, timeout=30) as c:
        assert c.generate("stories", "Once upon a time", max_tokens=2)
        # It is "remote": held to remote's models.
        with pytest.raises(PermissionDenied, match="app 'remote' may not use model"):
            c.generate("stories-q4", "Once upon a time", max_tokens=2)
    with Client(endpoint, server_key_file=str(keys["dir"] / "server.pub"),
                client_key_file=secret, timeout=30) as c:
        c.ping()
    monkeypatch.setenv("CORRAL_SERVER_KEY", keys["server"])
    monkeypatch.setenv("CORRAL_CLIENT_KEY_FILE", secret)
    with Client(endpoint, timeout=30) as c:
        c.ping()

    async def main() -> None:
        async with AsyncClient(endpoint, timeout=30) as a:
            await a.ping()

    asyncio.run(main())
    # The CLI: the same environment, or its flags.
    r = subprocess.run([corral_path(), "--endpoint", endpoint, "ps"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    monkeypatch.delenv("CORRAL_SERVER_KEY")
    monkeypatch.delenv("CORRAL_CLIENT_KEY_FILE")
    r = subprocess.run(
        [corral_path(), "--endpoint", endpoint, "--server-key", keys["server"],
         "--client-key-file", secret, "run", "stories", "Once upon a time", "-n", "2"],
        capture_output=True, text=True, timeout=30,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("kind", ["no key", "unknown key"])
def test_a_refused_tcp_client_is_told_at_once(tcp_daemon, keys, kind):
    d, endpoint = tcp_daemon
    args = {} if kind == "no key" else {
        "server_key": keys["server"], "client_key_file": str(keys["dir"] / "stranger.key")}
    words = ("tcp needs CURVE keys" if kind == "no key"
             else "refused this client's CURVE key: no app lists its public key")
    with Client(endpoint, timeout=PROMPT_WAIT_S, **args) as c:
        for _ in range(2):  # the refusal is final: the next call says so at once too
            t0 = time.monotonic()
            with pytest.raises(PermissionDenied, match=words):
                c.generate("stories", "Once upon a time", max_tokens=2)
            assert time.monotonic() - t0 < PROMPT_WAIT_S / 2

    async def main() -> None:
        async with AsyncClient(endpoint, timeout=PROMPT_WAIT_S, **args) as a:
            with pytest.raises(PermissionDenied, match=words):
                await a.ping()

    asyncio.run(main())
    cli = [corral_path(), "--endpoint", endpoint]
    if kind != "no key":
        cli += ["--server-key", keys["server"], "--client-key-file", args["client_key_file"]]
    r = subprocess.run(cli + ["ps"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr and words in r.stderr
    if kind == "unknown key":
        assert f"CURVE key {keys['stranger']} is not in any app's curve_keys" in d.log()
    else:
        assert 'msg="connection refused" endpoint=tcp://' in d.log()


def test_a_client_refused_in_a_loop_does_not_flood_the_log(tcp_daemon):
    """A peer that retries a refused connection in a loop gets 20 log records per 10 s, not one per
    attempt (the next record says how many were left out)."""
    d, endpoint = tcp_daemon
    before = d.log().count('msg="connection refused"')
    for _ in range(50):
        with Client(endpoint, timeout=PROMPT_WAIT_S) as c:
            with pytest.raises(PermissionDenied, match="tcp needs CURVE keys"):
                c.ping()
    logged = d.log().count('msg="connection refused"') - before
    print(f"{logged} of 50 refusals logged")
    assert 1 <= logged <= 20, logged


def test_key_mistakes_are_refused_by_the_client(tcp_daemon, keys):
    d, endpoint = tcp_daemon
    secret = keys["dir"] / "client.key"
    with pytest.raises(InvalidArgument, match="CORRAL_CLIENT_KEY_FILE"):
        Client(endpoint, server_key=keys["server"])
    with pytest.raises(InvalidArgument, match="corrald's public key"):
        Client(endpoint, client_key_file=str(secret))
    with pytest.raises(InvalidArgument, match="not a CURVE public key"):
        Client(endpoint, server_key="not a key", client_key_file=str(secret))
    os.chmod(secret, 0o644)
    with pytest.raises(PermissionDenied, match=f"{secret} has mode 644.*chmod 600"):
        Client(endpoint, server_key=keys["server"], client_key_file=str(secret))
    # ipc never uses CURVE: keys given (or in the environment) do not get in its way.
    with Client(d.endpoint, server_key="ignored for ipc", timeout=30) as c:
        c.ping()


def test_a_user_no_app_lists_is_refused_at_once(start_corrald):
    d = start_corrald("auth: {owner: false}\napps:\n  - name: someone\n    uids: [4000000000]\n")
    with Client(d.endpoint, timeout=PROMPT_WAIT_S) as c:
        for _ in range(2):
            t0 = time.monotonic()
            with pytest.raises(PermissionDenied,
                               match=f"no app lists this user \\(uid {os.geteuid()}"):
                c.ping()
            assert time.monotonic() - t0 < PROMPT_WAIT_S / 2
    assert "auth.owner is false and no app lists" in d.log()
