"""The machine model: what the CPU heuristics (`opt.heuristic`) derive their register blocks, cache blocking and
packing thresholds from, instead of constants measured on one machine.

`Machine.from_sysfs(root)` reads, under `root` (the real machine: "/"; tests: a fake tree):
- the vector ISA from `proc/cpuinfo` (x86-64 `flags`: avx512f -> 32 registers of 64 bytes, avx -> 16 of 32, else 16
  of 16 (Intel SDM vol. 1, the AVX-512 and AVX register chapters); aarch64 `Features`: NEON's 32 V registers of 16
  bytes (Arm ARM, the SIMD&FP register file; SVE's length isn't in cpuinfo, NEON is what LLVM targets by default)),
  and the x86-64 `ISA_FLAGS` it lists (`Machine.isa`: what the CPU reports; `tiny_codegen.cpu_probe` checks it runs);
- the caches from `sys/devices/system/cpu/cpu0/cache/index*/{level,type,size,shared_cpu_list,ways_of_associativity,
  number_of_sets,coherency_line_size}` (the same files on x86-64 and aarch64 Linux);
- the cores this process may run on (`os.sched_getaffinity` on the real machine, `sys/devices/system/cpu/online` in
  a fake tree) and the page size.
What a tree doesn't say falls back to `DEFAULTS` (stated there).

`host_machine()` reads the real machine once per process (on first use, never at import), then applies the
`TINY_MACHINE` environment variable: comma-separated `field=value` overrides of `Machine`'s fields, sizes with an
optional K/M/G suffix, e.g. `TINY_MACHINE=l2=1M,l3=32M,l3_shared=8,vector_registers=16,vector_bytes=32` (an AVX2
znver3-like model on any host, to reproduce its heuristic choices).

Stdlib only: the model is plain data, so tests and tools can build one without a compiler.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Machine", "DEFAULTS", "ISA_FLAGS", "host_machine", "machine_of", "parse_overrides", "L3_SHARE_MAX_L2"]

DEFAULTS = {"l1d": 32 << 10, "l1d_ways": 8, "line": 64, "l2": 1 << 20, "l2_shared": 1, "l3": 32 << 20,
            "l3_shared": 8, "page_size": 4096}
"""What a machine whose sysfs has no cache information is taken to have: a 32 KB 8-way L1d with 64-byte lines, a
private 1 MB L2 and 32 MB of L3 shared by 8 cores (AMD Zen 4's core complex, which the heuristics were first tuned
on; a current x86-64 or Neoverse core has at least that much L1d and L2 per core), and 4 KB pages."""

ISA_FLAGS = frozenset({"f16c", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx512_vnni", "avx512vl",
                       "avx_vnni"})
"""The x86-64 cpuinfo flags the model keeps (`Machine.isa`): the half/bfloat16 conversions and products that kernels
may use when `tiny_codegen.cpu_probe` confirms they execute, and the int8 dot products (`vpdpbusd`: AVX512-VNNI with
AVX512VL for its 256-bit form, or AVX-VNNI) `tiny_codegen.x86_vnni` uses."""

L3_SHARE_MAX_L2 = 8
"""A core's share of the L3 is taken as at most this many times its L2. Every design listed in test_machine.py has a
smaller ratio (Zen 3: 32 MB over 8 cores of 512 KB L2 = 8; Zen 4: 4; Sapphire Rapids: 105 MB over 56 cores of 2 MB
= 0.94), but a virtual machine lists only its own vCPUs in `shared_cpu_list`, so it reads the whole host L3 as its
own (a 2-vCPU Xeon guest: 300 MB "shared by 2", 150 MB a core) while other tenants fill it."""

_FIELDS_INT = ("vector_bytes", "vector_registers", "fma_units", "l1d", "l1d_ways", "line", "l2", "l2_shared", "l3",
               "l3_shared", "cores", "page_size")


@dataclass(frozen=True)
class Machine:
  """One CPU as the heuristics see it. Sizes in bytes; `*_shared`: how many CPUs share that cache."""
  arch: str                # "x86_64", "aarch64", or what platform.machine() says
  vector_bytes: int        # bytes of one vector register (0: none known)
  vector_registers: int    # how many of them (0: none known)
  fma_units: int           # vector FMAs issued per cycle (see `_fma_units`)
  l1d: int                 # L1 data cache of one core
  l1d_ways: int            # its associativity
  line: int                # cache line
  l2: int
  l2_shared: int
  l3: int                  # 0: no L3
  l3_shared: int
  cores: int               # CPUs this process may run on
  page_size: int
  isa: frozenset[str] = frozenset()  # the `ISA_FLAGS` cpuinfo lists (what the CPU reports; `cpu_probe` checks it runs)

  @property
  def l1d_set_span(self) -> int:
    """Bytes after which addresses map to the same L1d set again (size / ways): rows this far apart (or a multiple)
    compete for one set's `l1d_ways` lines (4 KB on Zen 4's 32 KB 8-way L1d and on a 48 KB 12-way one)."""
    return max(self.line, self.l1d // max(1, self.l1d_ways))

  @property
  def l3_per_core(self) -> int:
    """One core's share of the last-level cache: L3 over the CPUs that share it, at most `L3_SHARE_MAX_L2` L2s;
    the L2 when there is no L3."""
    if not self.l3: return self.l2
    return min(self.l3 // max(1, self.l3_shared), L3_SHARE_MAX_L2 * self.l2)

  @classmethod
  def from_sysfs(cls, root: str = "/", arch: str | None = None) -> Machine:
    """The machine described by the cpuinfo and sysfs files under `root` (see the module docstring); `arch`
    defaults to the host's for "/" and to what cpuinfo says (flags: x86_64, Features: aarch64) otherwise."""
    cpuinfo = _read(os.path.join(root, "proc/cpuinfo")) or ""
    if arch is None: arch = platform.machine() if os.path.abspath(root) == "/" else _arch_of(cpuinfo)
    arch = {"amd64": "x86_64", "AMD64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    vbytes, vregs = _vector_file(arch, cpuinfo)
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M) if arch == "x86_64" else None
    isa = frozenset(f for f in m.group(1).split() if f in ISA_FLAGS) if m else frozenset()
    caches = _caches(os.path.join(root, "sys/devices/system/cpu/cpu0/cache"))
    l1 = caches.get(1, {})
    l2, l3 = caches.get(2, {}), caches.get(3, {})
    if os.path.abspath(root) == "/": cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    else: cores = _count_cpus(_read(os.path.join(root, "sys/devices/system/cpu/online")) or "0")
    page = os.sysconf("SC_PAGE_SIZE") if os.path.abspath(root) == "/" and hasattr(os, "sysconf") else 0
    # a tree with an L2 but no L3 has none; one without cache information at all takes the stated L3
    no_info = not caches
    return cls(arch=arch, vector_bytes=vbytes, vector_registers=vregs, fma_units=_fma_units(arch, vbytes),
               l1d=l1.get("size", DEFAULTS["l1d"]), l1d_ways=l1.get("ways", DEFAULTS["l1d_ways"]),
               line=l1.get("line", DEFAULTS["line"]), l2=l2.get("size", DEFAULTS["l2"]),
               l2_shared=l2.get("shared", DEFAULTS["l2_shared"]),
               l3=l3.get("size", DEFAULTS["l3"] if no_info else 0), l3_shared=l3.get("shared", DEFAULTS["l3_shared"]),
               cores=max(1, cores), page_size=page or DEFAULTS["page_size"], isa=isa)

  @classmethod
  def default(cls, arch: str = "x86_64", vector_bytes: int = 64, vector_registers: int = 32, cores: int = 1) -> Machine:
    """A machine with the stated `DEFAULTS` caches and the given vector register file (what a sysfs tree without
    cache information gives): the fixed model tests pin when they assert register-file-dependent choices."""
    return cls(arch=arch, vector_bytes=vector_bytes, vector_registers=vector_registers,
               fma_units=_fma_units(arch, vector_bytes), l1d=DEFAULTS["l1d"], l1d_ways=DEFAULTS["l1d_ways"],
               line=DEFAULTS["line"], l2=DEFAULTS["l2"], l2_shared=DEFAULTS["l2_shared"], l3=DEFAULTS["l3"],
               l3_shared=DEFAULTS["l3_shared"], cores=cores, page_size=DEFAULTS["page_size"])

  def with_overrides(self, spec: str) -> Machine:
    """This machine with the `TINY_MACHINE`-style overrides in `spec` applied (see `parse_overrides`)."""
    changes: dict[str, Any] = dict(parse_overrides(spec))
    return dataclasses.replace(self, **changes)


def parse_overrides(spec: str) -> dict[str, int | str]:
  """`field=value` pairs, comma-separated, to `Machine` fields: integers take an optional K/M/G suffix (powers of
  1024); `arch` a name. Raises ValueError naming a bad field or value and what is valid."""
  out: dict[str, int | str] = {}
  for part in (p.strip() for p in spec.split(",")):
    if not part: continue
    key, sep, val = part.partition("=")
    key, val = key.strip(), val.strip()
    if not sep or key not in (*_FIELDS_INT, "arch"):
      raise ValueError(f"TINY_MACHINE: {part!r} is not field=value with a field of {('arch', *_FIELDS_INT)}")
    if key == "arch":
      out[key] = val
      continue
    m = re.fullmatch(r"(\d+)\s*([KMGkmg]?)[Bb]?", val)
    if m is None: raise ValueError(f"TINY_MACHINE: {key}={val!r} is not a non-negative integer with optional K/M/G")
    out[key] = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
  return out


@functools.cache
def _host(spec: str) -> Machine:
  return Machine.from_sysfs("/").with_overrides(spec)


def host_machine() -> Machine:
  """This host's `Machine` (read once per `TINY_MACHINE` value), with the `TINY_MACHINE` overrides applied."""
  return _host(os.environ.get("TINY_MACHINE", ""))


def machine_of(renderer: object) -> Machine:
  """The machine a renderer's kernels run on: its `machine` attribute when it has one (the CPU renderers), else
  the host's."""
  m = getattr(renderer, "machine", None)
  return m if isinstance(m, Machine) else host_machine()


def _read(path: str) -> str | None:
  try:
    with open(path) as f: return f.read()
  except OSError:
    return None


def _arch_of(cpuinfo: str) -> str:
  if re.search(r"^flags\s*:", cpuinfo, re.M): return "x86_64"
  if re.search(r"^Features\s*:", cpuinfo, re.M): return "aarch64"
  return platform.machine()


def _vector_file(arch: str, cpuinfo: str) -> tuple[int, int]:
  """(bytes, count) of the vector registers (see the module docstring); (0, 0) for an unknown architecture or an
  x86-64 without a cpuinfo flags line (macOS: the renderer then takes LLVM's host features alone)."""
  if arch == "x86_64":
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    if m is None: return 0, 0
    flags = set(m.group(1).split())
    if "avx512f" in flags: return 64, 32
    return (32, 16) if "avx" in flags else (16, 16)
  if arch == "aarch64": return 16, 32
  return 0, 0


def _fma_units(arch: str, vector_bytes: int) -> int:
  """Vector FMAs per cycle, which no file reports: 2 on x86-64 with AVX or wider (Haswell and later, Zen 1-5 each
  issue two FMAs a cycle; some AVX-512 parts fuse their two 256-bit ports into one 512-bit one, which only halves
  peak, not the accumulators a block needs) and on aarch64 (Neoverse N1/V1 and Cortex-A7x: two 128-bit FMA pipes),
  else 1. Documented defaults: override with TINY_MACHINE=fma_units=N."""
  return 2 if (arch == "x86_64" and vector_bytes >= 32) or arch == "aarch64" else 1


FMA_LATENCY = 4
"""Cycles from an FMA's issue to its result being usable by the next FMA on the same accumulator: 4 on every core the
machine model covers (Haswell to Sapphire Rapids, Zen 2-5, Neoverse N1/V1, Cortex-A76+); no file reports it."""


def fma_chains(m: Machine) -> int:
  """The independent accumulator chains that keep `m`'s FMA units busy: FMA_LATENCY x `fma_units` (8 on AVX2,
  AVX-512 and NEON cores with two FMA pipes, 4 with one). The CPU heuristics size matrix-vector blocks by it, and
  the lowering chains unrolled lanes into accumulators only in loops with that many (`lower_reduces`)."""
  return FMA_LATENCY * max(1, m.fma_units)


def _size(text: str) -> int:
  m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
  if m is None: return 0
  return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def _count_cpus(cpu_list: str) -> int:
  """How many CPUs a sysfs list names ("0-3,8-11" -> 8)."""
  n = 0
  for part in cpu_list.strip().split(","):
    if not part: continue
    lo, _, hi = part.partition("-")
    if lo.isdigit() and (not hi or hi.isdigit()): n += int(hi or lo) - int(lo) + 1
  return n


def _caches(d: str) -> dict[int, dict[str, int]]:
  """{level: {size, shared, ways, line}} of the data/unified caches in a sysfs cache folder (missing: {})."""
  out: dict[int, dict[str, int]] = {}
  try: names = sorted(n for n in os.listdir(d) if n.startswith("index"))
  except OSError: return out
  for name in names:
    p = os.path.join(d, name)
    level, kind, size = _read(f"{p}/level"), (_read(f"{p}/type") or "").strip(), _size(_read(f"{p}/size") or "")
    if level is None or not level.strip().isdigit() or kind not in ("Data", "Unified") or not size: continue
    ways, line = (_read(f"{p}/ways_of_associativity") or "").strip(), (_read(f"{p}/coherency_line_size") or "").strip()
    entry = {"size": size, "shared": max(1, _count_cpus(_read(f"{p}/shared_cpu_list") or "0"))}
    if ways.isdigit() and int(ways) > 0: entry["ways"] = int(ways)
    if line.isdigit() and int(line) > 0: entry["line"] = int(line)
    out[int(level)] = entry
  return out
