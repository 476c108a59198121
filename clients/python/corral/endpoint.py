"""The default endpoint, computed exactly as the daemon and the C client do
(base/src/endpoint.c): ``$CORRAL_ENDPOINT``, else ``ipc://$XDG_RUNTIME_DIR/corral/corral.sock``,
else ``ipc:///tmp/corral-$UID/corral.sock``."""

from __future__ import annotations

import os


def default_endpoint() -> str:
    """The endpoint a client uses when none is given."""
    env = os.environ.get("CORRAL_ENDPOINT")
    if env:
        return env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and runtime.startswith("/"):
        return f"ipc://{runtime}/corral/corral.sock"
    return f"ipc:///tmp/corral-{os.getuid()}/corral.sock"
