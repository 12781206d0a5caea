#!/usr/bin/env python3
"""pliant runs OpenBLAS's fast kernels on every CPU that has them: OpenBLAS chooses by
CPU model as the program loads and falls back to SSE3 kernels on models newer than the
library (kernels/cpu/blas_kernels.c); pliant then executes itself again with the best
kernel set the CPU runs. OPENBLAS_CORETYPE, when set, is obeyed.

Run: python3 tests/cli/test_blas_kernels.py --build build
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, Skip, Suite, check  # noqa: E402

suite = Suite("blas_kernels")
test = suite.test

FAST = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def cores_loaded(env_extra):
    """The OpenBLAS kernel sets `pliant version` loaded, in order (OPENBLAS_VERBOSE)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(env_extra, OPENBLAS_VERBOSE="2")
    p = subprocess.run([suite.pliant, "version"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    check(p.returncode == 0 and "pliant 0.1" in out, "pliant version: %s", out)
    return [c.lower() for c in re.findall(r"Core: (\S+)", out)]


@test
def a_cpu_with_avx2_gets_fast_kernels():
    if not {"avx2", "fma"} <= cpu_flags():
        raise Skip("this CPU has no AVX2 and FMA")
    cores = cores_loaded({})
    check(cores and cores[-1] in FAST, "OpenBLAS kernel sets loaded: %s", cores)
    check(len(cores) <= 2, "executed itself more than once: %s", cores)


@test
def openblas_coretype_is_obeyed():
    if "pni" not in cpu_flags():
        raise Skip("this CPU has no SSE3")
    cores = cores_loaded({"OPENBLAS_CORETYPE": "Prescott"})
    check(cores == ["prescott"], "OPENBLAS_CORETYPE=Prescott loaded %s", cores)


if __name__ == "__main__":
    sys.exit(suite.main())
