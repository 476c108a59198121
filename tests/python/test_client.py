"""Python client tests against a real corrald: ping, error mapping, endpoints, timeouts."""

from __future__ import annotations

import os
import tempfile

import pytest

import corral
from corral import Client, DeadlineExceeded
from corral._proto import pb
from corral.errors import ERRORS_BY_CODE, CorralError, error_for_code


def test_ping(corrald):
    with Client(corrald.endpoint) as c:
        pong = c.ping()
    assert pong.version == corral.__version__
    assert pong.protocol_version == pb.PROTOCOL_VERSION_CURRENT
    assert pong.uptime_ms >= 0


def test_ping_many_times_on_one_connection(corrald):
    with Client(corrald.endpoint) as c:
        uptimes = [c.ping().uptime_ms for _ in range(50)]
    assert uptimes == sorted(uptimes)


def test_every_wire_error_code_has_an_exception_class():
    names = {v.name for v in pb.ErrorCode.DESCRIPTOR.values if v.name != "OK"}
    assert names == set(ERRORS_BY_CODE)
    for name in names:
        exc = error_for_code(name, "boom")
        assert isinstance(exc, CorralError)
        assert exc.code == name
        assert str(exc) == f"{name}: boom"


def test_unknown_code_still_raises_corral_error():
    exc = error_for_code("FROM_THE_FUTURE", "x")
    assert type(exc) is CorralError and exc.code == "FROM_THE_FUTURE"


def test_default_endpoint_rules(monkeypatch):
    monkeypatch.delenv("CORRAL_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/42")
    assert corral.default_endpoint() == "ipc:///run/user/42/corral/corral.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert corral.default_endpoint() == f"ipc:///tmp/corral-{os.getuid()}/corral.sock"
    monkeypatch.setenv("CORRAL_ENDPOINT", "tcp://127.0.0.1:9")
    assert corral.default_endpoint() == "tcp://127.0.0.1:9"


def test_no_daemon_times_out_with_a_clear_error():
    with tempfile.TemporaryDirectory() as tmp:
        with Client(f"ipc://{tmp}/nobody.sock", timeout=0.2) as c:
            with pytest.raises(DeadlineExceeded, match="is it running"):
                c.ping()


@pytest.mark.corrald_config("log_level: debug\n")
def test_corrald_fixture_takes_a_config_body(corrald):
    with open(corrald.config_path, encoding="utf-8") as f:
        assert "log_level: debug" in f.read()
    with Client(corrald.endpoint) as c:
        assert c.ping().version == corral.__version__
