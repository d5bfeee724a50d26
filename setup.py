"""Build the compiled window kernel.

``TOKSTREAM_DEBUG=1`` at build time turns bounds, wraparound and initialisation checks on in the
kernel (CI runs the parity suite against that build too); the release build relies on the
Python-side validation to keep every index in range.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("TOKSTREAM_DEBUG", "0") == "1"

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
    "binding": True,
}

extensions = [
    Extension(
        f"tokstream.{name}",
        [f"src/tokstream/{name.replace('.', '/')}.pyx"],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O3"],
        define_macros=[("TOKSTREAM_DEBUG", "1" if DEBUG else "0")],
    )
    # The window kernel; the document kernel; the mixture kernel; read-ahead advice for
    # memory-mapped corpora; the plain C loop that benchmarks hold the kernel to; the device's
    # random-read rate that the cold-cache benchmark holds read-ahead to.
    for name in ("_windows", "_documents", "_mixture", "_advice", "bench._loop", "bench._device")
]

# include_path: the kernels cimport the shared token type from src/tokstream/_types.pxd.
setup(ext_modules=cythonize(extensions, compiler_directives=directives, include_path=["src"]))
