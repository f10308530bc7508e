"""Wheel of the kvpool Python package, built offline from this checkout:

    python3 -m pip wheel --no-build-isolation ./python        (from the repository root)

The C extension is built by the project's CMake build (the one `scripts/build.sh` makes, in
$KVP_BUILD_DIR or ../build; configured here if it does not exist yet) and copied into the
wheel: one abi3 build loads in every CPython >= 3.8. libkvpool is linked into the module; the
system libraries it uses (libczmq, libzmq, libraft, libuv, libprotobuf-c, libjansson, liblz4,
libxxhash, libsodium) must be installed where the wheel is used. The mooncake alias package
(python/alias) is not part of the wheel.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("KVP_BUILD_DIR") or os.path.join(SRC, "build"))


def version():
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        m = re.search(r"project\(kvpool VERSION ([0-9.]+)", f.read())
    return m.group(1) if m else "0.0.0"


class CMakeBuildExt(build_ext):
    """Build the kvpool_python CMake target and copy its output as the extension."""

    def build_extension(self, ext):
        if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", SRC, "-B", BUILD, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                                   "-DPython3_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", BUILD, "--target", "kvpool_python", "-j2"])
        built = os.path.join(BUILD, "python", "kvpool", "_kvpool.abi3.so")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(
    name="kvpool",
    version=version(),
    description="kvpool client: the MooncakeDistributedStore surface over libkvpool",
    packages=["kvpool"],
    package_dir={"kvpool": "kvpool"},
    ext_modules=[Extension("kvpool._kvpool", sources=[], py_limited_api=True)],
    cmdclass={"build_ext": CMakeBuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp38"}},
    python_requires=">=3.8",
    zip_safe=False,
)
