"""Build hook: generate corral/corral_pb2.py from proto/corral.proto with protoc at build time,
so that no generated code is checked in. Everything else is declared in pyproject.toml.

The package builds from the corral source tree (the .proto file lives two folders up, at
proto/corral.proto), with protoc installed (Debian: protobuf-compiler).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


class BuildWithProto(build_py):
    """build_py, then protoc into the built package."""

    def run(self):
        super().run()
        proto = os.path.join(PROTO_DIR, "corral.proto")
        if not os.path.exists(proto):
            raise SystemExit(f"cannot build corral: {proto} not found (build from the corral tree)")
        protoc = shutil.which("protoc")
        if protoc is None:
            raise SystemExit("cannot build corral: protoc not found (Debian: protobuf-compiler)")
        out_dir = os.path.join(self.build_lib, "corral")
        os.makedirs(out_dir, exist_ok=True)
        subprocess.check_call([protoc, f"--python_out={out_dir}", f"-I{PROTO_DIR}", proto])


setup(cmdclass={"build_py": BuildWithProto})
