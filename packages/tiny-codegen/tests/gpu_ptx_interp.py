"""Test helper: a small PTX interpreter for the subset PTXRenderer emits, so its kernels can be checked against numpy
without a GPU. Registers hold raw bits (Python ints; predicates bools); each instruction reinterprets them by its
type (`.f32` through numpy float32, `.f16` through float16, ...), so rounding matches IEEE single/half/double.
Threads of a block run one after another up to each `bar.sync` (generators), blocks one after another; a warp-wide
`mma.sync` (m16n8k16 f16/bf16, m16n8k8 f16) gathers the fragments of the block's 32 lanes, laid out as the PTX ISA's
"Matrix Fragments for mma.m16n8k16 / m16n8k8" figures give them, and computes D = A*B + C.
`run(ptx, name, bufs, global_size, local_size, vals)` runs kernel `name` on numpy arrays in place.
"""
from __future__ import annotations

import re
import struct
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

_FLOAT = {"f16": (np.float16, "<e", 16), "f32": (np.float32, "<f", 32), "f64": (np.float64, "<d", 64)}
_STRUCT = {"u8": "<B", "s8": "<b", "u16": "<H", "s16": "<h", "b16": "<H", "u32": "<I", "s32": "<i", "b32": "<I",
           "f32": "<I", "u64": "<Q", "s64": "<q", "b64": "<Q", "f64": "<Q", "f16": "<H"}


def _width(t: str) -> int: return int(t[1:]) if t != "pred" else 1


def _mask(v: int, bits: int) -> int: return v & ((1 << bits) - 1)


def _signed(v: int, bits: int) -> int:
  v = _mask(v, bits)
  return v - (1 << bits) if v >> (bits - 1) else v


def to_val(bits: int, t: str) -> Any:
  """Register bits as a value of PTX type `t` (numpy float for f16/f32/f64, int for integers)."""
  if t in _FLOAT:
    np_t, fmt, w = _FLOAT[t]
    return np_t(struct.unpack(fmt, _mask(bits, w).to_bytes(w // 8, "little"))[0])
  w = _width(t)
  return _signed(bits, w) if t[0] == "s" else _mask(bits, w)


def to_bits(v: Any, t: str) -> int:
  """A value as the bits of PTX type `t` (floats rounded to the type; ints wrapped)."""
  if t in _FLOAT:
    np_t, fmt, w = _FLOAT[t]
    return int.from_bytes(struct.pack(fmt, np_t(v)), "little")
  return _mask(int(v), _width(t))


class Kernel:
  """One parsed `.entry`: parameter names, shared arrays and instructions with resolved labels."""

  def __init__(self, ptx: str, name: str):
    m = re.search(rf"\.entry {re.escape(name)}\((.*?)\)\s*\{{(.*)\n\}}", ptx, re.S)
    if m is None: raise ValueError(f"no .entry {name} in the PTX")
    self.params = re.findall(r"\.param \.\w+(?: \.ptr \.global \.align \d+)? (\w+)", m.group(1))
    self.shared: dict[str, tuple[int, int]] = {}
    off = 0
    for sym, size in re.findall(r"\.shared \.align \d+ \.b8 (\w+)\[(\d+)\];", m.group(2)):
      self.shared[sym] = (off, int(size))
      off += int(size)
    self.shared_size = off
    self.insts: list[tuple[str | None, bool, str, list[str]]] = []
    self.labels: dict[str, int] = {}
    for line in m.group(2).split("\n"):
      line = line.split("//")[0].strip()
      if not line or line.startswith("."): continue
      if line.endswith(":"):
        self.labels[line[:-1]] = len(self.insts)
        continue
      pred, neg = None, False
      if line.startswith("@"):
        p, line = line.split(None, 1)
        neg, pred = p.startswith("@!"), p.lstrip("@!")
      op, _, rest = line.rstrip(";").partition(" ")
      args = [a.strip() for a in re.split(r",(?![^{]*\})", rest)] if rest.strip() else []
      self.insts.append((pred, neg, op, args))


class Machine:
  """Global memory (numpy buffers at fake addresses) and one block's shared memory."""

  def __init__(self, bufs: list[np.ndarray]):
    self.bufs = bufs
    self.base = [0x10000 * (i + 1) for i in range(len(bufs))]

  def mem(self, space: str, addr: int, shared: bytearray) -> tuple[memoryview, int]:
    if space == "shared": return memoryview(shared), addr
    for b, arr in zip(self.base, self.bufs):
      if b <= addr < b + max(arr.nbytes, 1): return memoryview(arr.view(np.uint8)), addr - b
    raise IndexError(f"global address {addr:#x} is outside every buffer")


def _imm(s: str, t: str) -> int:
  if s.startswith("0f"): return int(s[2:], 16)
  if s.startswith("0d"): return int(s[2:], 16)
  return to_bits(int(s, 0), t if t not in _FLOAT else "s64")


def _thread(k: Kernel, mach: Machine, params: dict[str, int], shared: bytearray, ctaid: tuple[int, ...],
            tid: tuple[int, ...]) -> Iterator[None]:
  regs: dict[str, Any] = {}
  special = {f"%ctaid.{a}": ctaid[i] for i, a in enumerate("xyz")} | {f"%tid.{a}": tid[i] for i, a in enumerate("xyz")}

  def get(a: str, t: str) -> Any:
    if a in regs: return regs[a]
    if a in special: return special[a]
    if a in k.shared: return k.shared[a][0]
    return _imm(a, t)

  pc = 0
  while pc < len(k.insts):
    pred, neg, op, args = k.insts[pc]
    pc += 1
    if pred is not None and bool(regs[pred]) == neg: continue
    parts = op.split(".")
    name, t = parts[0], parts[-1]
    if name == "ret": return
    if name == "bra":
      pc = k.labels[args[0]]
      continue
    if name == "bar":
      yield None
      continue
    if name == "mma":
      yield (op, args, regs)
      continue
    if name == "ld" and parts[1] == "param": regs[args[0]] = params[args[1].strip("[]")]
    elif name == "cvta": regs[args[0]] = regs[args[1]]
    elif name in ("ld", "st"):
      space = parts[1]
      addr_s = (args[1] if name == "ld" else args[0]).strip("[]")
      buf, off = mach.mem(space, regs[addr_s], shared)
      fmt = _STRUCT[t]
      size = struct.calcsize(fmt)
      names = (args[0] if name == "ld" else args[1]).strip("{}").split(", ")
      for i, r in enumerate(names):
        if name == "ld": regs[r] = _mask(struct.unpack_from(fmt, buf, off + i * size)[0], 64)
        else:
          v = to_val(get(r, t), t) if t[0] in "su" else _mask(get(r, t), size * 8)
          struct.pack_into(fmt, buf, off + i * size, v)
    elif name == "mov" and args[1].startswith("{"):  # pack: the first register is the low half
      parts_r = [x.strip() for x in args[1].strip("{}").split(",")]
      w = _width(t) // len(parts_r)
      regs[args[0]] = sum(_mask(regs[r], w) << (w * j) for j, r in enumerate(parts_r))
    elif name == "mov":
      regs[args[0]] = bool(get(args[1], t)) if t == "pred" else get(args[1], t)
    elif name == "setp":
      cmp, ty = parts[1], parts[2]
      a, b = to_val(get(args[1], ty), ty), to_val(get(args[2], ty), ty)
      unordered = ty in _FLOAT and (np.isnan(a) or np.isnan(b))
      res = {"lt": a < b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b, "neu": unordered or a != b,
             "nan": unordered}[cmp]
      regs[args[0]] = bool(res)
    elif name == "selp": regs[args[0]] = get(args[1], t) if regs[args[3]] else get(args[2], t)
    elif name in ("and", "or", "xor", "not"):
      if t == "pred":
        a = bool(regs[args[1]])
        regs[args[0]] = (not a) if name == "not" else \
          {"and": a and bool(regs[args[2]]), "or": a or bool(regs[args[2]]), "xor": a != bool(regs[args[2]])}[name]
      else:
        a, b = get(args[1], t), get(args[2], t)
        regs[args[0]] = _mask({"and": a & b, "or": a | b, "xor": a ^ b}[name], _width(t))
    elif name in ("shl", "shr"):
      a, sh = to_val(get(args[1], t), "u" + t[1:] if name == "shl" else t), to_val(get(args[2], "u32"), "u32")
      regs[args[0]] = to_bits((a << sh) if name == "shl" else (a >> sh), t)
    elif name == "cvt": regs[args[0]] = _cvt(parts, get(args[1], parts[-1]))
    elif name == "mul" and parts[1] == "wide":
      regs[args[0]] = to_bits(to_val(get(args[1], t), t) * to_val(get(args[2], t), t), "s64" if t[0] == "s" else "u64")
    else:
      a = [to_val(get(x, t), t) for x in args[1:]]
      with np.errstate(all="ignore"): res = _alu(name, t, a)
      regs[args[0]] = to_bits(res, t)
  return


def _alu(name: str, t: str, a: list[Any]) -> Any:
  isf = t in _FLOAT
  if name == "add": return a[0] + a[1]
  if name == "sub": return a[0] - a[1]
  if name == "mul": return a[0] * a[1]
  if name == "mad": return a[0] * a[1] + a[2]
  if name == "fma":  # one rounding: exact in rationals, then rounded (to double, then to the type)
    if not all(np.isfinite(x) for x in a): return np.float64(a[0]) * np.float64(a[1]) + np.float64(a[2])
    return float(Fraction(float(a[0])) * Fraction(float(a[1])) + Fraction(float(a[2])))
  if name == "neg": return -a[0]
  if name == "copysign": return np.copysign(a[1], a[0])
  if name == "div":
    if isf: return a[0] / a[1]
    q = abs(a[0]) // abs(a[1])
    return q if (a[0] >= 0) == (a[1] >= 0) else -q
  if name == "rem": return a[0] - a[1] * int(abs(a[0]) // abs(a[1]) * (1 if (a[0] >= 0) == (a[1] >= 0) else -1))
  if name == "rcp": return type(a[0])(1) / a[0]
  if name == "sqrt": return np.sqrt(a[0])
  if name == "ex2": return np.exp2(np.float64(a[0]))
  if name == "lg2": return np.log2(np.float64(a[0])) if a[0] > 0 else (-np.inf if a[0] == 0 else np.nan)
  raise NotImplementedError(f"PTX interpreter has no {name}.{t}")


def _cvt(parts: list[str], bits: int) -> int:
  rnd = parts[1] if parts[1] in ("rn", "rzi") else None
  dst, src = parts[-2], parts[-1]
  v = to_val(bits, src)
  if dst in _FLOAT:
    if src in _FLOAT and rnd == "rzi": return to_bits(np.trunc(v), dst)
    return to_bits(v, dst)
  if src in _FLOAT:
    if np.isnan(v): return 0
    w = _width(dst)
    lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dst[0] == "s" else (0, (1 << w) - 1)
    v = hi if v == np.inf else lo if v == -np.inf else min(max(int(np.trunc(v)), lo), hi)  # PTX cvt saturates
  w = _width(dst)
  v = _signed(v, w) if dst[0] == "s" else _mask(v, w)
  return _mask(v, 64) if w < 16 else to_bits(v, dst)  # 8-bit results stay extended in their 16-bit register


def run(ptx: str, name: str, bufs: list[np.ndarray], global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
        vals: tuple[int, ...] = (), globals_: list[int] | None = None) -> None:
  """Run kernel `name` of `ptx` over `global_size` blocks of `local_size` threads on `bufs` (in place)."""
  k = Kernel(ptx, name)
  order = globals_ if globals_ is not None else list(range(len(bufs)))
  mach = Machine([bufs[s] for s in order])
  params = dict(zip(k.params, [*mach.base, *[to_bits(v, "s32") for v in vals]]))
  lsz = tuple(local_size or (1, 1, 1))
  for gz in range(global_size[2]):
    for gy in range(global_size[1]):
      for gx in range(global_size[0]):
        shared = bytearray(k.shared_size)
        threads = [_thread(k, mach, params, shared, (gx, gy, gz), (tx, ty, tz))
                   for tz in range(lsz[2]) for ty in range(lsz[1]) for tx in range(lsz[0])]
        while threads:
          alive, mmas = [], []
          for th in threads:
            try:
              if (got := next(th)) is not None: mmas.append(got)
              alive.append(th)
            except StopIteration: pass
          if mmas: _mma(mmas)
          threads = alive


def _frag_a(k: int, i: int, lane: int) -> tuple[int, int]:
  g, t = lane >> 2, lane % 4
  if k == 16: return (g if i in (0, 1, 4, 5) else g + 8, t * 2 + (i & 1) + (8 if i >= 4 else 0))
  return (g if i < 2 else g + 8, t * 2 + (i & 1))


def _frag_b(k: int, i: int, lane: int) -> tuple[int, int]:
  g, t = lane >> 2, lane % 4
  return (t * 2 + (i & 1) + (8 if k == 16 and i >= 2 else 0), g)


def _frag_c(i: int, lane: int) -> tuple[int, int]:
  g, t = lane >> 2, lane % 4
  return (g if i < 2 else g + 8, t * 2 + (i & 1))


def _mma(lanes: list[tuple[str, list[str], dict]]) -> None:
  """One warp's mma.sync.aligned.m16n8k{8,16}.row.col.f32.{f16,bf16}.{f16,bf16}.f32 over its 32 lanes."""
  if len(lanes) != 32: raise ValueError(f"mma.sync needs a full warp of 32 lanes, got {len(lanes)}")
  op = lanes[0][0]
  k, tin = int(re.search(r"m16n8k(\d+)", op).group(1)), op.split(".")[-2]  # type: ignore[union-attr]

  def half(bits: int) -> float:
    return float(to_val(bits, "f16")) if tin == "f16" else float(to_val(bits << 16, "f32"))

  A, B, C = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
  for lane, (_, args, regs) in enumerate(lanes):
    d, a, b, c = ([x.strip() for x in arg.strip("{}").split(",")] for arg in args)
    elems = [half((regs[r] >> (16 * j)) & 0xFFFF) for r in a for j in (0, 1)]  # low half first
    for i, v in enumerate(elems): A[_frag_a(k, i, lane)] = v
    for i, v in enumerate(half((regs[r] >> (16 * j)) & 0xFFFF) for r in b for j in (0, 1)): B[_frag_b(k, i, lane)] = v
    for i, r in enumerate(c): C[_frag_c(i, lane)] = float(to_val(regs[r], "f32"))
  D = (A @ B + C).astype(np.float32)
  for lane, (_, args, regs) in enumerate(lanes):
    for i, r in enumerate(x.strip() for x in args[0].strip("{}").split(",")):
      regs[r] = to_bits(D[_frag_c(i, lane)], "f32")
