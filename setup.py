"""Build the compiled kernels (src/tokstream/_windows.pyx and src/tokstream/_kernels/).

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
        # The release build carries no debug information (-g0 overrides the -g in Python's own
        # flags): a third less compiling, a smaller wheel, the same code.
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O3", "-g0"],
        define_macros=[("TOKSTREAM_DEBUG", "1" if DEBUG else "0")],
    )
    # The window kernel (the loop that fills a batch's windows); the other kernels
    # (src/tokstream/_kernels/): the document gather, one corpus's implicit order, the mixture's
    # order, read-ahead advice for memory-mapped corpora, packed rows (best fit; the rows' copy),
    # the repetition filter.
    # Then the plain C loop that benchmarks hold the kernels to and the device's random-read
    # rate that the cold-cache benchmark holds read-ahead to.
    for name in (
        "_windows",
        "_kernels.documents",
        "_kernels.order",
        "_kernels.mixture",
        "_kernels.advice",
        "_kernels.pack",
        "_kernels.packed_copy",
        "_kernels.repetition",
        "bench._loop",
        "bench._device",
    )
]

# include_path: the kernels cimport their shared pieces (src/tokstream/_kernels/*.pxd, as
# tokstream._kernels.NAME, from _windows.pyx too);
# nthreads and build_ext's parallel: the modules are translated to C, then compiled, one process
# a core (a pip install from source on 2 cores: 95 s serially, 47 s so).
setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        include_path=["src"],
        nthreads=os.cpu_count() or 1,
    ),
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
