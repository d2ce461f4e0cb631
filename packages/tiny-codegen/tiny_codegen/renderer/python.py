"""The PYTHON renderer: linear UOps serialized as text, which the PYTHON device (tiny-runtime-cpu) parses back and
interprets with GPU semantics. It is the reference every other backend is checked against.

One line per UOp, tab-separated: ``index  OP  dtype  sources  arg``, after a header line. For example::

    # tiny PYTHON program v1
    0\tPARAM\tfloat32*16\t\t0
    1\tSPECIAL\tint32\t2\t'gidx0'
    ...

- dtype: ``float32``, ``float32x4`` (vector), ``float32*16`` (global pointer to 16 elements), ``float32*16@LOCAL``,
  ``float32*1@REG``, with ``:v4`` for a vector pointer; ``void``.
- sources: comma-separated indices of earlier lines.
- arg: a Python literal (ints, floats with ``inf``/``nan``, strings, tuples, ``Ops.ADD``, ``AxisType.LOOP``,
  ``KernelInfo(...)``), or ``pickle:<base64>`` for anything else. `parse` reads it back into the same UOps.
"""
from __future__ import annotations

import base64
import math
import pickle
from typing import Any

from tiny_uop.device import Compiler, Renderer
from tiny_uop.dtype import INVERSE_DTYPES_DICT, AddrSpace, DType, ImageDType, PtrDType, dtypes
from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp

HEADER = "# tiny PYTHON program v1"
_ARG_NAMES: dict[str, Any] = {"Ops": Ops, "AxisType": AxisType, "KernelInfo": KernelInfo, "inf": math.inf,
                              "nan": math.nan, "AddrSpace": AddrSpace, "True": True, "False": False, "None": None}


# ***** dtypes *****
def encode_dtype(dt: DType) -> str:
  """``float32``, ``int32x4``, ``float32*16@LOCAL:v4``: a dtype as a token without spaces or tabs."""
  if isinstance(dt, ImageDType): raise TypeError(f"the PYTHON renderer has no image dtypes, got {dt!r}")
  if isinstance(dt, PtrDType):
    out = f"{encode_dtype(dt.base)}*{dt.size}"
    if dt.addrspace is not AddrSpace.GLOBAL: out += f"@{dt.addrspace.name}"
    return out + (f":v{dt.v}" if dt.v != 1 else "")
  name = INVERSE_DTYPES_DICT[dt.scalar().name]
  return name if dt.count == 1 else f"{name}x{dt.count}"


def decode_dtype(s: str) -> DType:
  """The dtype `encode_dtype` wrote."""
  if "*" in s:
    base, _, rest = s.partition("*")
    v = 1
    if ":v" in rest: rest, _, vs = rest.partition(":v"); v = int(vs)  # noqa: E702
    size, _, space = rest.partition("@")
    ptr = decode_dtype(base).ptr(int(size), AddrSpace[space] if space else AddrSpace.GLOBAL)
    return ptr.vec(v) if v != 1 else ptr
  name, _, count = s.partition("x")
  if not hasattr(dtypes, name) or not isinstance(dt := getattr(dtypes, name), DType):
    raise ValueError(f"unknown dtype {name!r} in PYTHON program")
  return dt.vec(int(count)) if count else dt


# ***** args *****
def _same(a: Any, b: Any) -> bool:
  return type(a) is type(b) and (a == b or repr(a) == repr(b))  # repr: nan == nan


def decode_arg(s: str) -> Any:
  """The arg `encode_arg` wrote."""
  if s.startswith("pickle:"): return pickle.loads(base64.b64decode(s[7:]))  # noqa: S301 -- our own output
  return eval(s, {"__builtins__": {}}, dict(_ARG_NAMES)) if s else None  # noqa: S307 -- literals of our own output


def encode_arg(arg: Any) -> str:
  """A literal that `decode_arg` turns back into an equal arg (checked), else pickled."""
  if arg is None: return ""
  text = repr(arg)
  if "\t" not in text and "\n" not in text:
    try:
      if _same(decode_arg(text), arg): return text
    except (SyntaxError, NameError, AttributeError, TypeError, ValueError): pass  # noqa: S110 -- not a literal: pickle
  return "pickle:" + base64.b64encode(pickle.dumps(arg)).decode()


# ***** programs *****
def serialize(uops: list[UOp]) -> str:
  """Text of a linear program (see the module docstring)."""
  ids: dict[UOp, int] = {}
  lines = [HEADER]
  for i, u in enumerate(uops):
    srcs = []
    for s in u.src:
      if s not in ids: raise ValueError(f"uop {i} ({u.op}) uses a {s.op} that is not earlier in the linear program")
      srcs.append(str(ids[s]))
    lines.append(f"{i}\t{u.op.name}\t{encode_dtype(u.dtype)}\t{','.join(srcs)}\t{encode_arg(u.arg)}")
    ids[u] = i
  return "\n".join(lines) + "\n"


def parse(text: str | bytes) -> list[UOp]:
  """The linear UOps of a serialized program."""
  if isinstance(text, (bytes, bytearray, memoryview)): text = bytes(text).decode()
  lines = text.splitlines()
  if not lines or lines[0] != HEADER:
    raise ValueError(f"not a PYTHON program (first line {lines[:1]!r}, want {HEADER!r})")
  uops: list[UOp] = []
  for n, line in enumerate(lines[1:], 1):
    if not line: continue
    try:
      idx, op, dt, srcs, arg = line.split("\t")
      if int(idx) != len(uops): raise ValueError(f"index {idx}, expected {len(uops)}")
      uops.append(UOp(Ops[op], decode_dtype(dt), tuple(uops[int(s)] for s in srcs.split(",") if s), decode_arg(arg)))
    except Exception as e:
      raise ValueError(f"PYTHON program line {n} is malformed: {line!r}: {e}") from e
  return uops


class PythonCompiler(Compiler):
  """The 'binary' of a PYTHON program is its text, encoded."""

  def __init__(self, cachekey: str | None = None): super().__init__(None)
  def compile(self, src: str) -> bytes: return src.encode()
  def disassemble(self, lib: bytes) -> str: return lib.decode()


class PythonRenderer(Renderer):
  """Linear UOps -> text for the PYTHON device: GPU-style (SPECIAL gidx/lidx, local memory, barriers), no threads."""
  device = "PYTHON"
  has_local = True
  has_shared = True
  has_threads = False
  supports_float4 = True
  global_max = (0x8FFFFFFF,) * 3
  local_max = (1024, 1024, 64)
  shared_max = 32768
  compiler_cls = PythonCompiler

  def render(self, uops: list[UOp]) -> str: return serialize(uops)
