"""Build hook: compiles the Go library (cmd/libtensorlane) as a shared library
with the Go toolchain found on PATH and ships it inside the package.

The repository root is the parent of this directory (pip builds in tree);
TENSORLANE_SRC overrides it. Without a Go toolchain the build stops and says
so, rather than producing a package that cannot load.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


class BuildGoLibrary(build_py):
    def run(self):
        super().run()
        src = Path(os.environ.get("TENSORLANE_SRC", HERE.parent)).resolve()
        if not (src / "go.mod").is_file() or not (src / "cmd" / "libtensorlane").is_dir():
            sys.exit(
                f"tensorlane: the Go sources are not at {src} (want go.mod and cmd/libtensorlane); "
                "build from a checkout of the repository (pip install ./python) or set TENSORLANE_SRC"
            )
        go = shutil.which("go")
        if go is None:
            sys.exit(
                "tensorlane: building the shared library needs the Go toolchain (go 1.26 or newer) "
                "on PATH, and none was found. Install Go (https://go.dev/dl/) and retry."
            )
        out = Path(self.build_lib).resolve() / "tensorlane" / "_lib" / "libtensorlane.so"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        cmd = [go, "build", "-buildmode=c-shared", "-o", str(out), "./cmd/libtensorlane"]
        print("tensorlane: " + " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=src, env=env, check=True)
        header = out.with_suffix(".h")
        if header.exists():
            header.unlink()  # the stable header is cmd/libtensorlane/tensorlane.h


class BinaryDistribution(Distribution):
    """The package carries a native library: wheels are platform specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildGoLibrary}, distclass=BinaryDistribution)
