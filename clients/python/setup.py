"""Build hook: generate corral/corral_pb2.py from proto/corral.proto with protoc at build time,
so that no generated code is checked in. Everything else is declared in pyproject.toml."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


class BuildWithProto(build_py):
    def run(self):
        super().run()
        out_dir = os.path.join(self.build_lib, "corral")
        os.makedirs(out_dir, exist_ok=True)
        subprocess.check_call(
            ["protoc", f"--python_out={out_dir}", f"-I{PROTO_DIR}", "corral.proto"]
        )


setup(cmdclass={"build_py": BuildWithProto})
