"""Imported first (`python -m pytest -p tests.avx2_only`, or `import tests.avx2_only` in a fresh process), this
makes the process compute as an x86 machine without AVX-512 would, where it can: bitsandbytes' CPU library and
torch take their AVX2 paths. Set NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" as well for numpy's.
How the suite was checked on an AVX-512 machine for the AVX2-only ones (issue 28), and what
tests/test_quant_bnb.py's test_the_twin_is_the_same_without_avx512 does.

libbitsandbytes_cpu.so decides once per process, in a function-local static `supported_avx512f` (guarded by a
C++ init guard), whether to use its AVX-512 kernels; no environment variable changes it. Here the guard is set
and the flag cleared before any call, at the offsets `nm` gives (bitsandbytes 0.50.2), so every later call takes
the non-AVX-512 (scalar) kernels. ATEN_CPU_CAPABILITY=avx2 makes torch (and bitsandbytes' Python side, which asks
torch) see an AVX2 machine too.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

os.environ["ATEN_CPU_CAPABILITY"] = "avx2"

import bitsandbytes  # loads the library, after the variable torch reads at its import

lib = os.path.join(os.path.dirname(bitsandbytes.__file__), "libbitsandbytes_cpu.so")
symbols = subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout.split("\n")
statics = [line.split() for line in symbols if "supported_avx512f" in line]
assert len(statics) == 4, statics
with open("/proc/self/maps") as maps:
    base = min(int(line.split("-")[0], 16) for line in maps if line.rstrip().endswith(lib) and " 00000000 " in line)
for address, _, name in statics:
    value = 1 if name.startswith("_ZGV") else 0  # guard: initialised; flag: no AVX-512
    ctypes.c_uint8.from_address(base + int(address, 16)).value = value
assert bitsandbytes.cextension.lib.has_avx512f_cpu() == 0
print("tests.avx2_only: bitsandbytes' CPU library takes its non-AVX-512 kernels, torch its AVX2 ones")
