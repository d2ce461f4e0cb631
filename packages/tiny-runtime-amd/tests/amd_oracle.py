"""tinygrad 0.14.0's generated AMD bindings, loaded as a test-only oracle WITHOUT importing tinygrad itself.

The wheel's `tinygrad/runtime/autogen/{kfd,amd_gpu,amdgpu_kd}.py` and `autogen/am/{pm4_nv,sdma_6_0_0,regs}.py` are
Python transcriptions (by tinygrad's header generator) of Linux's kfd_ioctl.h, nvd.h, gc_11_0_0_offset.h/_sh_mask.h
and sdma_v6_0_0_pkt_open.h, ROCm's rocr SDMA/PM4 structs and LLVM's AMDHSA kernel descriptor. They import only
`tinygrad.runtime.support.c` (ctypes helpers), which imports `tinygrad.helpers` for five names. Here the package is
located with importlib (nothing executed), `c.py` is executed with a five-name stand-in for `tinygrad.helpers`, and each
binding file is executed under a private module name while those two stand-ins sit in sys.modules; sys.modules is then
put back as it was, so `import tinygrad` elsewhere still gets the real package and nothing of tinygrad's runtime runs.

Missing tinygrad is an error, not a skip: it is a test dependency (noxfile.py TEST_DEPS).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

_STANDIN = ("tinygrad", "tinygrad.helpers", "tinygrad.runtime", "tinygrad.runtime.support",
            "tinygrad.runtime.support.c")


def _root() -> Path:
  spec = importlib.util.find_spec("tinygrad")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError("tinygrad==0.14.0 (the test-only oracle for AMD hardware facts) is not installed; "
                      "`nox -s tests` installs it (noxfile.py TEST_DEPS)")
  return Path(next(iter(spec.submodule_search_locations)))


def _exec(name: str, path: Path) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location(name, path)
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod
  spec.loader.exec_module(mod)
  mod.unsigned = lambda x: x & 0xFFFFFFFF  # the headers' `(unsigned)(x)` casts became calls of `unsigned`
  return mod


@functools.cache
def _load() -> dict[str, types.ModuleType]:
  root = _root()
  saved = {k: sys.modules[k] for k in _STANDIN if k in sys.modules}
  try:
    for k in _STANDIN[:4]: sys.modules[k] = types.ModuleType(k)
    sys.modules["tinygrad"].__path__ = []  # type: ignore[attr-defined]
    helpers = sys.modules["tinygrad.helpers"]
    helpers.ceildiv = lambda a, b: -(a // -b)  # type: ignore[attr-defined]
    helpers.getenv = lambda key, default=0: default  # type: ignore[attr-defined]
    helpers.DEBUG, helpers.OSX, helpers.WIN = 0, False, False  # type: ignore[attr-defined]
    c = _exec("tinygrad.runtime.support.c", root / "runtime/support/c.py")
    sys.modules["tinygrad.runtime.support"].c = c  # type: ignore[attr-defined]
    files = {"kfd": "runtime/autogen/kfd.py", "amd_gpu": "runtime/autogen/amd_gpu.py",
             "amdgpu_kd": "runtime/autogen/amdgpu_kd.py", "pm4_nv": "runtime/autogen/am/pm4_nv.py",
             "sdma_6_0_0": "runtime/autogen/am/sdma_6_0_0.py", "regs": "runtime/autogen/am/regs.py",
             "soc_11": "runtime/autogen/am/soc_11.py", "pm4_soc15": "runtime/autogen/am/pm4_soc15.py",
             "sdma_4_0_0": "runtime/autogen/am/sdma_4_0_0.py"}
    return {k: _exec(f"_tinygrad_oracle_{k}", root / f) for k, f in files.items()}
  finally:
    for k in _STANDIN: sys.modules.pop(k, None)
    for k in list(sys.modules):
      if k.startswith("_tinygrad_oracle_"): del sys.modules[k]
    sys.modules.update(saved)


def module(name: str) -> types.ModuleType:
  """One binding module: kfd, amd_gpu, amdgpu_kd, pm4_nv, sdma_6_0_0, regs, soc_11."""
  return _load()[name]


def ioctl(name: str) -> tuple[int, int, int, type]:
  """(direction, type char, nr, struct class) of kfd.AMDKFD_IOC_<name> (a functools.partial of tinygrad's ioctl)."""
  p = getattr(module("kfd"), f"AMDKFD_IOC_{name}")
  assert isinstance(p, functools.partial), p
  direction, base, nr, struct = p.args[:4]
  return direction, base, nr, struct


def ioctl_number(name: str) -> int:
  """The ioctl request number, `_IOC(dir, type, nr, size)` as tinygrad's helper computes it."""
  d, base, nr, st = ioctl(name)
  return (d << 30) | (st.SIZE << 16) | (base << 8) | nr


def struct_fields(st: type) -> list[tuple[str, int, int]]:
  """(name, byte offset, byte size) of a struct's top-level fields, from the generated `register_fields` list."""
  return [(f[0], f[2], ctypes.sizeof(f[1])) for f in st._real_fields_]  # type: ignore[attr-defined]


def field_mask(mod: types.ModuleType, macro: str) -> int:
  """The in-place mask of a field macro `lambda x: ((unsigned)(x) & M) << S`: the macro applied to all ones."""
  return getattr(mod, macro)(0xFFFFFFFF)


def sdma_dword(packet: str, dword: str, version: str = "sdma_6_0_0") -> tuple[int, dict[str, int]]:
  """(dword index, {field: in-place mask}) of dword `dword` (HEADER, COUNT, ADDR_LO, DW5 ...) of SDMA v6 packet
  `packet` (or of another SDMA version's module), from SDMA_PKT_<packet>_<dword>_<field>_offset / _mask / _shift."""
  m = module(version)
  pre = f"SDMA_PKT_{packet}_{dword}_"
  idx: set[int] = set()
  fields: dict[str, int] = {}
  for k, v in vars(m).items():
    if k.startswith(pre) and k.endswith("_offset") and k[len(pre)].islower():
      stem = k[:-len("_offset")]
      idx.add(v)
      fields[stem[len(pre):]] = getattr(m, f"{stem}_mask") << getattr(m, f"{stem}_shift")
  if len(idx) != 1: raise KeyError(f"SDMA_PKT_{packet}_{dword}: dword indices {idx}")
  return idx.pop(), fields


def gc11_register(name: str) -> tuple[int, dict[str, tuple[int, int]]]:
  """(absolute dword offset, {field: (lo, hi)}) of gc_11_0_0's reg<name>: regs.py offset + GC_BASE__INST0_SEG<idx>."""
  off, base_idx, fields = module("regs").gc_11_0_0[f"reg{name}"]
  return off + getattr(module("amd_gpu"), f"GC_BASE__INST0_SEG{base_idx}"), fields


def value(mod: str, name: str) -> Any: return getattr(module(mod), name)


def cdna_isa() -> types.ModuleType:
  """The CDNA ISA opcode enums (`autogen/amd/cdna/enum.py`, generated from AMD's machine-readable ISA XML; it imports
  only `autogen/amd/common.py`, which imports `enum`): loaded the same way, under stand-in package names."""
  return isa_enums("cdna")


@functools.cache
def isa_enums(arch: str) -> types.ModuleType:
  """The opcode enums of one ISA (`autogen/amd/<arch>/enum.py`: "cdna", "rdna3"), generated from AMD's
  machine-readable ISA XML (see cdna_isa)."""
  root = _root()
  names = ("tinygrad", "tinygrad.runtime", "tinygrad.runtime.autogen", "tinygrad.runtime.autogen.amd",
           "tinygrad.runtime.autogen.amd.common")
  saved = {k: sys.modules[k] for k in names if k in sys.modules}
  try:
    for k in names[:4]:
      sys.modules[k] = types.ModuleType(k)
      sys.modules[k].__path__ = []  # type: ignore[attr-defined]
    _exec("tinygrad.runtime.autogen.amd.common", root / "runtime/autogen/amd/common.py")
    return _exec(f"_tinygrad_oracle_{arch}_enum", root / f"runtime/autogen/amd/{arch}/enum.py")
  finally:
    for k in names: sys.modules.pop(k, None)
    sys.modules.pop(f"_tinygrad_oracle_{arch}_enum", None)
    sys.modules.update(saved)


def cdna_opcodes(enum: str) -> dict[int, str]:
  """{opcode: lower-case name} of one CDNA ISA enum (SOP1Op, VOP2Op, DSOp, ...)."""
  return isa_opcodes("cdna", enum)


def isa_opcodes(arch: str, enum: str) -> dict[int, str]:
  """{opcode: lower-case name} of one enum (SOPCOp, VOP1Op, ...) of AMD's ISA XML for `arch` ("cdna", "rdna3")."""
  return {m.value: m.name.lower() for m in getattr(isa_enums(arch), enum)}


def gc943_register(name: str) -> tuple[int, dict[str, tuple[int, int]]]:
  """(dword offset within GC segment 0, {field: (lo, hi)}) of gc_9_4_3's reg<name>."""
  off, base_idx, fields = module("regs").gc_9_4_3[f"reg{name}"]
  assert base_idx == 0, base_idx
  return off, fields
