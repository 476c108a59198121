"""The Python package builds: setup.py's hook generates corral_pb2.py into the built package, and
the built package (with py.typed) imports on its own, without the source tree's copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import ROOT


def test_setup_py_build_generates_the_protocol_module(tmp_path):
    # Build a copy, so the source tree gets no build droppings (egg-info, build/).
    tree = tmp_path / "tree"
    shutil.copytree(
        os.path.join(ROOT, "clients", "python"),
        tree / "clients" / "python",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "corral_pb2.py"),
    )
    shutil.copytree(os.path.join(ROOT, "proto"), tree / "proto")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build", "--build-base", str(out)],
        cwd=tree / "clients" / "python",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pkg = out / "lib" / "corral"
    for name in ("__init__.py", "client.py", "aio.py", "types.py", "corral_pb2.py", "py.typed"):
        assert (pkg / name).is_file(), name

    # The built package imports its own corral_pb2 (no PYTHONPATH to build/python).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import corral, corral._proto as p; "
            "assert p.pb.__name__ == 'corral.corral_pb2', p.pb.__name__; "
            "assert p.pb.Generate.DESCRIPTOR.fields_by_name['constraint'].number == 19; "
            "print(corral.__file__)",
        ],
        cwd=out / "lib",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip() == str(pkg / "__init__.py")
