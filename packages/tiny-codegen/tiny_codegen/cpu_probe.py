"""Whether this x86-64 CPU really executes an instruction set extension, asked of a child process.

`/proc/cpuinfo`'s flags (read into `tiny_codegen.machine.Machine.isa`) say what the CPU reports, not what runs: a
virtual machine can list `amx_tile` while its hypervisor doesn't enable the tile state (XCR0), so `tileloadd` raises
SIGILL there (the 2-vCPU Xeon 6/207 this project measures on). A kernel built on a flag alone would kill the user's
process. So before the heuristics choose such instructions, `executes(feature)` runs a few bytes of machine code
using them in a fresh Python child (`sys.executable`, stdlib ctypes: an executable mapping, then a call): exit
status 0 means they ran; a signal (SIGILL) or any other status means they didn't, and only the child dies. The
answer is cached per process, and the child runs only when the flags list the feature (else: False at once).

Features (`PROBES`):
- "avx512_bf16": `vdpbf16ps zmm0, zmm0, zmm0` (AVX512-BF16: pairs of bfloat16 products summed into float32 lanes);
- "amx_bf16": `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (Linux 5.16+: a process must ask for the AMX
  tile state before using it; refused -> exit status 3), then `ldtilecfg` of a one-tile palette-1 configuration,
  `tileloadd` of 16 rows of 64 bytes, `tdpbf16ps`, `tilerelease`.
- "avx512_vnni": `vpdpbusd ymm0, ymm0, ymm0` in its EVEX encoding (AVX512-VNNI with AVX512VL: int8 dot products);
- "avx_vnni": the same instruction VEX-encoded (AVX-VNNI, on CPUs without AVX-512).
Encodings from the Intel SDM vol. 2 (VDPBF16PS; LDTILECFG, TILELOADD, TDPBF16PS, TILERELEASE; VPDPBUSD), checked with
`llvm-mc -show-encoding`. `TINY_CPU_PROBE=0` answers False for every feature without a child (to pin the fallback).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys

__all__ = ["PROBES", "executes"]

_PRELUDE = """
import ctypes, mmap, sys
def run(code, *args):
  buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  buf.write(code)
  addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
  return ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * len(args))(addr)(*args)
"""

_AVX512_BF16 = _PRELUDE + """
run(bytes([0x62, 0xf2, 0x7e, 0x48, 0x52, 0xc0,   # vdpbf16ps zmm0, zmm0, zmm0
           0xc5, 0xf8, 0x77,                     # vzeroupper
           0x31, 0xc0, 0xc3]))                   # xor eax, eax; ret
"""

_AMX_BF16 = _PRELUDE + """
libc = ctypes.CDLL(None, use_errno=True)
SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # asm/unistd_64.h, asm/prctl.h
if libc.syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0: sys.exit(3)
cfg = (ctypes.c_uint8 * 64)()
cfg[0] = 1                                       # palette 1
for t in range(3): cfg[16 + 2 * t], cfg[48 + t] = 64, 16  # tiles 0-2: 16 rows of 64 bytes
data = (ctypes.c_uint8 * 1024)()
run(bytes([0xc4, 0xe2, 0x78, 0x49, 0x07,         # ldtilecfg [rdi]
           0xba, 0x40, 0x00, 0x00, 0x00,         # mov edx, 64 (the row stride)
           0xc4, 0xe2, 0x7b, 0x4b, 0x0c, 0x16,   # tileloadd tmm1, [rsi + rdx]
           0xc4, 0xe2, 0x7b, 0x4b, 0x14, 0x16,   # tileloadd tmm2, [rsi + rdx]
           0xc4, 0xe2, 0x7b, 0x49, 0xc0,         # tilezero tmm0
           0xc4, 0xe2, 0x6a, 0x5c, 0xc1,         # tdpbf16ps tmm0, tmm1, tmm2
           0xc4, 0xe2, 0x78, 0x49, 0xc0,         # tilerelease
           0x31, 0xc0, 0xc3]),                   # xor eax, eax; ret
    ctypes.addressof(cfg), ctypes.addressof(data))
"""

_AVX512_VNNI = _PRELUDE + """
run(bytes([0x62, 0xf2, 0x7d, 0x28, 0x50, 0xc0,   # vpdpbusd ymm0, ymm0, ymm0 (EVEX.256: AVX512-VNNI + VL)
           0xc5, 0xf8, 0x77,                     # vzeroupper
           0x31, 0xc0, 0xc3]))                   # xor eax, eax; ret
"""

_AVX_VNNI = _PRELUDE + """
run(bytes([0xc4, 0xe2, 0x7d, 0x50, 0xc0,         # {vex} vpdpbusd ymm0, ymm0, ymm0 (AVX-VNNI)
           0xc5, 0xf8, 0x77,                     # vzeroupper
           0x31, 0xc0, 0xc3]))                   # xor eax, eax; ret
"""

PROBES = {"avx512_bf16": (("avx512_bf16",), _AVX512_BF16), "amx_bf16": (("amx_tile", "amx_bf16"), _AMX_BF16),
          "avx512_vnni": (("avx512_vnni", "avx512vl"), _AVX512_VNNI), "avx_vnni": (("avx_vnni",), _AVX_VNNI)}
"""feature -> (the /proc/cpuinfo flags that must all be listed, the child's program)."""

PROBE_TIMEOUT_S = 30.0
"""A child that hasn't answered by then counts as "doesn't execute" (a Python start takes well under a second)."""


def _flags() -> frozenset[str]:
  from tiny_codegen.machine import host_machine
  return host_machine().isa


def executes(feature: str, flags: frozenset[str] | None = None) -> bool:
  """Whether this CPU runs `feature`'s instructions (one of `PROBES`): its flags (`flags`, default the host machine
  model's `isa`) list it and a child process ran them (see the module docstring). ValueError for an unknown one."""
  if feature not in PROBES: raise ValueError(f"cpu_probe: unknown feature {feature!r}; valid: {sorted(PROBES)}")
  if os.environ.get("TINY_CPU_PROBE", "1") == "0" or platform.machine().lower() not in ("x86_64", "amd64"):
    return False
  if not all(f in (_flags() if flags is None else flags) for f in PROBES[feature][0]): return False
  return probe(feature) == 0


@functools.cache
def probe(feature: str) -> int:
  """The child's exit status for `feature`'s program (0: it ran; negative: the signal that ended it, -4 SIGILL;
  3: the kernel refused the AMX tile state; 124: no answer within PROBE_TIMEOUT_S). Runs it whatever the flags say:
  `executes` is the question to ask."""
  try:
    res = subprocess.run([sys.executable, "-I", "-c", PROBES[feature][1]], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S, check=False)
  except subprocess.TimeoutExpired:
    return 124
  return res.returncode
