"""The converting copies of ``_kernels/convert.h`` (tokens of one dtype into int32 or int64
batches), compiled as the kernels are and once for each x86-64 level the CPU runs, against
NumPy's casts."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from tests.test_kernel import run_portable_c

SOURCES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
#: Every (token dtype, output dtype) pair the kernels convert (the rest are copied by memcpy).
PAIRS = [(s, o) for o in ("int32", "int64") for s in SOURCES if s != o]

CONVERT_MAIN = (
    r"""
#include <stdio.h>
#include <inttypes.h>
#include "convert.h"
int main(void) {
    /* Each line: n v[0] ... v[n-1] (as uint64, cast to each token dtype); prints, per pair,
     * whether a token did not fit and the converted values. */
    int64_t n, i;
    uint64_t v[512];
    while (scanf("%" SCNd64, &n) == 1) {
        for (i = 0; i < n; i++) {
            if (scanf("%" SCNu64, &v[i]) != 1) return 1;
        }
"""
    + "".join(
        f"""        {{
            {s}_t in[512];
            {o}_t out[512];
            for (i = 0; i < n; i++) in[i] = ({s}_t)v[i];
            printf("%d", tokstream_convert_{s}_{o}(in, n, out) != 0);
            for (i = 0; i < n; i++) printf(" %" PRId64, (int64_t)out[i]);
            printf("\\n");
        }}
"""
        for s, o in PAIRS
    )
    + r"""    }
    return 0;
}
"""
)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), or none."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def levels() -> list[pytest.param]:
    """The builds to test: as the kernels are built (the clones, where the compiler makes
    them), plain C, and plain C for each x86-64 level this CPU can run."""
    params = [
        pytest.param([], id="as-built"),
        pytest.param(["-DTOKSTREAM_PORTABLE_CONVERT"], id="plain"),
    ]
    x86 = platform.machine() in ("x86_64", "AMD64")
    flags = cpu_flags()
    for level, needs in (
        ("x86-64-v3", {"avx2"}),
        ("x86-64-v4", {"avx512f", "avx512bw", "avx512vl"}),
    ):
        runs = x86 and needs <= flags
        params.append(
            pytest.param(
                ["-DTOKSTREAM_PORTABLE_CONVERT", f"-march={level}"],
                id=level,
                marks=pytest.mark.skipif(not runs, reason=f"this CPU does not run {level}"),
            )
        )
    return params


@pytest.mark.parametrize("defines", levels())
def test_converted_tokens_equal_numpys_cast_and_a_token_outside_int32_is_flagged(tmp_path, defines):
    rng = np.random.default_rng(0)
    edges = np.array(
        [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
         2**64 - 2**31, 2**64 - 2**31 - 1, 255, 128, 2**15, 2**16 - 1],
        dtype=np.uint64,
    )  # fmt: skip
    cases = []
    for _ in range(300):
        n = int(rng.integers(0, 100))
        values = rng.integers(0, 50257, n).astype(np.uint64)
        hits = rng.random(n) < rng.choice([0.0, 0.02, 0.3])
        values[hits] = rng.choice(edges, int(hits.sum()))
        cases.append(values)
    text = "".join(f"{len(v)} {' '.join(map(str, v.tolist()))}\n" for v in cases)
    out = iter(run_portable_c(tmp_path, CONVERT_MAIN, defines, text).splitlines())
    for values in cases:
        for source, output in PAIRS:
            flag, *converted = (int(x) for x in next(out).split())
            tokens = values.astype(source)
            assert converted == tokens.astype(output).tolist(), (source, output, values)
            as_int = [int(t) for t in tokens.tolist()]
            outside = output == "int32" and any(not -(2**31) <= t < 2**31 for t in as_int)
            assert flag == outside, (source, output, values)
