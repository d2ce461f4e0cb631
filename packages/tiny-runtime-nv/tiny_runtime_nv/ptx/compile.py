"""Parsed PTX statements -> Python closures over lane columns (one per instruction, built once per kernel).

Each closure is `fn(c, m)`: `c` is the running `Lanes` (register file `c.R`, lane count, memory, shared and local
memory), `m` the active-lane mask (None: every lane). Semantics follow the PTX ISA (sections "Instructions"):
integer ops wrap, float ops round to nearest (`.rn`, and the default), `cvt` float->int saturates (NaN -> 0) with
the given rounding, comparisons are ordered unless `u`-suffixed, `min`/`max` on floats return the non-NaN operand.
Transcendentals (`ex2.approx`, `lg2.approx`, `sin.approx`, ...) are computed in float64 and rounded (more accurate
than the SFU's ~2 ulp). An instruction the executor does not know raises NotImplementedError naming it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tiny_runtime_nv.ptx import mma
from tiny_runtime_nv.ptx.parse import Entry, PTXParseError, Stmt
from tiny_runtime_nv.ptx.values import FLOATS, NP, SIGNED, UNSIGNED, as_type, bf16_to_f32, f32_to_bf16, fit, fma64, \
  ftz, np_type, round_odd_to_f32

OP, BRA, RET, BAR = 0, 1, 2, 3
SPECIALS = ("%tid.x", "%tid.y", "%tid.z", "%ntid.x", "%ntid.y", "%ntid.z", "%ctaid.x", "%ctaid.y", "%ctaid.z",
            "%nctaid.x", "%nctaid.y", "%nctaid.z", "%laneid", "%warpid")
# generic addresses of the shared and local windows (cvta.shared / cvta.local): far above any host address
SHARED_WINDOW, LOCAL_WINDOW = 0xFE00_0000_0000_0000, 0xFD00_0000_0000_0000
WINDOW_SIZE = 1 << 40
_SKIP_MODS = {"nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "volatile", "relaxed", "acquire", "release", "weak",
              "sys", "gpu", "cta", "uni", "aligned", "sync", "approx", "full", "rn", "ftz", "sat", "lo", "wide",
              "hi", "rzi", "rni", "rmi", "rpi", "acq_rel", "sc", "to"}


@dataclass
class Inst:
  """A compiled statement: its kind (OP, BRA, RET, BAR), closure, guard predicate register, branch target."""
  kind: int
  fn: Callable[[Any, Any], None] | None
  pred: int | None
  neg: bool
  target: int
  text: str


def _int_imm(s: str) -> int | None:
  t = s.strip()
  neg = t.startswith("-")
  t = t.lstrip("-+")
  try:
    if t.startswith(("0x", "0X")): v = int(t[2:].rstrip("Uu"), 16)
    elif t.startswith(("0b", "0B")): v = int(t[2:].rstrip("Uu"), 2)
    elif len(t) > 1 and t.startswith("0") and t.rstrip("Uu").isdigit(): v = int(t.rstrip("Uu"), 8)
    else: v = int(t.rstrip("Uu"))
  except ValueError: return None
  return -v if neg else v


def imm(s: str, t: str) -> Any:
  """The immediate `s` (`42`, `-1`, `0x3C00`, `0f3F800000`, `0d3FF0000000000000`, `1.5`) as a numpy scalar of
  PTX type `t`."""
  dt = np_type(t)
  if re.fullmatch(r"-?0[fF][0-9a-fA-F]{8}", s):
    v = np.array([int(s.lstrip("-")[2:], 16)], np.uint32).view(np.float32)[0]
    v = -v if s.startswith("-") else v
    return as_type(np.array([v], np.float32), dt)[0] if t not in FLOATS else dt.type(v)
  if re.fullmatch(r"-?0[dD][0-9a-fA-F]{16}", s):
    v = np.array([int(s.lstrip("-")[2:], 16)], np.uint64).view(np.float64)[0]
    return dt.type(-v if s.startswith("-") else v)
  if (i := _int_imm(s)) is not None:
    if t in FLOATS: return dt.type(i)
    if dt == np.bool_: return np.bool_(i != 0)
    return np.array([i & ((1 << (8 * dt.itemsize)) - 1)], UNSIGNED[dt.itemsize]).view(dt)[0]
  try: return dt.type(float(s))
  except ValueError: raise PTXParseError(f"can't read operand {s!r} as .{t}") from None


class Compiler:
  """Compiles an `Entry`'s statements; register names become indices into the lane register file."""

  def __init__(self, e: Entry):
    self.e = e
    self.reg_index: dict[str, int] = {}
    self.reg_dtype: list[np.dtype] = []
    for name, t in e.regs.items(): self._new_reg(name, NP.get(t, np.dtype(np.uint32)) if t != "pred" else NP["pred"])
    self.specials: dict[str, int] = {}
    self.params = {p.name: p for p in e.params}

  def _new_reg(self, name: str, dt: np.dtype) -> int:
    self.reg_index[name] = len(self.reg_dtype)
    self.reg_dtype.append(dt)
    return self.reg_index[name]

  def compile(self) -> list[Inst]:
    out = []
    for s in self.e.stmts:
      try: out.append(self.inst(s))
      except NotImplementedError as ex: raise NotImplementedError(f"{ex} (in `{s.line}`)") from None
    return out

  # ***** operands *****
  def reg(self, tok: str) -> int:
    tok = tok.strip()
    if tok in self.reg_index: return self.reg_index[tok]
    if tok in SPECIALS or tok.startswith(("%tid", "%ctaid", "%ntid", "%nctaid")):
      if tok in ("%tid", "%ctaid", "%ntid", "%nctaid"): tok += ".x"
      if tok not in SPECIALS: raise NotImplementedError(f"special register {tok}")
      if tok not in self.specials: self.specials[tok] = self._new_reg(tok, np.dtype(np.uint32))
      return self.specials[tok]
    raise PTXParseError(f"unknown register {tok!r}")

  def is_reg(self, tok: str) -> bool: return tok.strip().startswith("%")

  def src(self, tok: str, t: str) -> Callable[[list], Any]:
    """A reader of operand `tok` as PTX type `t`: `f(R) -> array or numpy scalar`."""
    tok = tok.strip()
    dt = np_type(t)
    neg = False
    if tok.startswith("!") and t == "pred": tok, neg = tok[1:], True
    if self.is_reg(tok):
      i = self.reg(tok)
      rdt = self.reg_dtype[i]
      # each reader says what it does (`.src`), so blocks.py can write the same read inline
      if neg: return _tag(lambda R: ~R[i], ("reg", i, "not", np.dtype(np.bool_), rdt))
      if rdt == dt: return _tag(lambda R: R[i], ("reg", i, "same", dt, rdt))
      if rdt.itemsize == dt.itemsize and np.bool_ not in (rdt, dt):
        return _tag(lambda R: R[i].view(dt), ("reg", i, "view", dt, rdt))
      return _tag(lambda R: as_type(R[i], dt), ("reg", i, "conv", dt, rdt))
    if tok in self.e.shared: v = imm(str(self.e.shared[tok]), t)
    elif tok == self.e.dynamic_shared: v = imm(str(self.e.shared_size), t)
    elif tok in self.e.local: v = imm(str(self.e.local[tok]), t)
    elif (m := re.fullmatch(r"([\w$]+)\s*\[\s*(\d+)\s*\]", tok)) and m.group(1) in {**self.e.shared, **self.e.local}:
      # `mov.u64 %rd, A[5]`: the address of A's element 5 (PTX ISA, mov: "move address of A[5] into ptr")
      name = m.group(1)
      base = self.e.shared[name] if name in self.e.shared else self.e.local[name]
      v = imm(str(base + int(m.group(2)) * self.e.elem_size.get(name, 1)), t)
    else: v = imm(tok, t)
    return _tag(lambda R: v, ("imm", v))

  def dst(self, tok: str) -> int:
    if not self.is_reg(tok): raise PTXParseError(f"destination {tok!r} is not a register")
    return self.reg(tok)

  def writer(self, tok: str) -> Callable[[Any, Any, Any], None]:
    """`w(c, value, m)`: write a lane column (or scalar) into register `tok` under mask `m`."""
    i = self.dst(tok)
    rdt = self.reg_dtype[i]

    def w(c: Any, v: Any, m: Any) -> None:
      if type(v) is not np.ndarray or v.dtype != rdt:  # noqa: E721 (hot path)
        v = as_type(fit(np.asarray(v), rdt), rdt)  # registers always hold their declared type
      if v.shape != (c.L,): v = np.broadcast_to(v, (c.L,))
      c.R[i] = v if m is None else np.where(m, v, c.R[i])
    return _tag(w, (i, rdt))

  def sub_writer(self, tok: str) -> Callable[[Any, Any, Any], None]:
    """`w(c, values, m)`: write values computed for the active lanes only (`len(values) == m.sum()`)."""
    i = self.dst(tok)
    rdt = self.reg_dtype[i]

    def w(c: Any, v: Any, m: Any) -> None:
      v = as_type(fit(np.asarray(v), rdt), rdt)
      if m is None:
        c.R[i] = v
        return
      out = c.R[i].copy()
      out[m] = v
      c.R[i] = out
    return w

  def address(self, tok: str) -> tuple[Callable[[list], Any], int, str | None]:
    """`[base+off]` -> (base reader as u64 or constant, offset, param/shared/local symbol or None)."""
    inner = tok.strip()
    if not (inner.startswith("[") and inner.endswith("]")): raise PTXParseError(f"{tok!r} is not an address")
    inner = inner[1:-1].replace(" ", "")
    m = re.fullmatch(r"([%\w$.]+?)?(?:\+(-?\w+))?", inner)
    if m is None: raise PTXParseError(f"can't read address {tok!r}")
    base, off = m.group(1), _int_imm(m.group(2)) if m.group(2) else 0
    if off is None: raise PTXParseError(f"can't read address offset in {tok!r}")
    if base is None or _int_imm(base) is not None:
      v = np.uint64((_int_imm(base) or 0) if base else 0)
      return (lambda R: v), off, None
    if base in self.params: return (lambda R: np.uint64(0)), off, base
    if base in self.e.shared or base == self.e.dynamic_shared or base in self.e.local:
      return self.src(base, "u64"), off, None
    return self.src(base, "u64"), off, None

  # ***** instructions *****
  def inst(self, s: Stmt) -> Inst:
    parts = s.op.split(".")
    name = parts[0]
    pred = self.reg(s.pred) if s.pred is not None else None
    if name == "bra":
      if s.args[0] not in self.e.labels: raise PTXParseError(f"branch to unknown label {s.args[0]!r}")
      return Inst(BRA, None, pred, s.neg, self.e.labels[s.args[0]], s.line)
    if name in ("ret", "exit"): return Inst(RET, None, pred, s.neg, 0, s.line)
    if name in ("bar", "barrier"):
      if len(parts) > 1 and parts[1] in ("warp",): return Inst(OP, lambda c, m: None, pred, s.neg, 0, s.line)
      if len(parts) > 1 and parts[1] not in ("sync", "cta") or "arrive" in parts or "red" in parts:
        raise NotImplementedError(f"PTX executor: unsupported {s.op}")
      return Inst(BAR, None, pred, s.neg, 0, s.line)
    if name in ("membar", "fence"): return Inst(OP, lambda c, m: None, pred, s.neg, 0, s.line)
    fn = getattr(self, f"c_{name}", None)
    if fn is None: raise NotImplementedError(f"PTX executor: unknown instruction {s.op}")
    return Inst(OP, fn(parts, list(s.args)), pred, s.neg, 0, s.line)

  def _binop(self, parts: list[str], a: list[str], f: Callable[..., Any], nsrc: int = 2) -> Callable:
    t = parts[-1]
    srcs = [self.src(x, t) for x in a[1:1 + nsrc]]
    w = self.writer(a[0])
    if nsrc == 1:
      s0 = srcs[0]
      return _spec(lambda c, m: w(c, f(s0(c.R)), m), f, srcs, w)
    if nsrc == 2:
      s0, s1 = srcs
      return _spec(lambda c, m: w(c, f(s0(c.R), s1(c.R)), m), f, srcs, w)
    s0, s1, s2 = srcs
    return _spec(lambda c, m: w(c, f(s0(c.R), s1(c.R), s2(c.R)), m), f, srcs, w)

  @staticmethod
  def _float_mods(parts: list[str]) -> None:
    for p in parts[1:-1]:
      if p in ("rz", "rm", "rp"): raise NotImplementedError(f"PTX executor: rounding mode .{p} in {'.'.join(parts)}")

  def _float(self, parts: list[str], a: list[str], f32: Callable, nsrc: int = 2) -> Callable:
    """A float op: float32/float64 natively, float16 through float64 with one rounding; `.ftz`/`.sat` applied."""
    t = parts[-1]
    self._float_mods(parts)
    if t not in FLOATS: raise NotImplementedError(f"PTX executor: {'.'.join(parts)}")
    flush, sat = "ftz" in parts and t == "f32", "sat" in parts
    if t == "f16":
      def f(*xs: Any) -> Any: return np.asarray(f32(*(np.asarray(x, np.float64) for x in xs))).astype(np.float16)
    elif flush:
      def f(*xs: Any) -> Any: return ftz(np.asarray(f32(*(ftz(np.asarray(x)) for x in xs)), np.float32))
    else: f = f32
    if sat:
      g = f

      def f(*xs: Any) -> Any:
        r = np.asarray(g(*xs))
        return np.where(np.isnan(r), r.dtype.type(0), np.clip(r, 0, 1)).astype(r.dtype)
    return self._binop(parts, a, _quiet(f), nsrc)

  def c_add(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, _add)
    return _wrapping(self._binop(p, a, _add))

  def c_sub(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, _sub)
    return _wrapping(self._binop(p, a, _sub))

  def c_mul(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    if t in FLOATS: return self._float(p, a, _mul)
    dt, size = np_type(t), np_type(t).itemsize
    if "wide" in p:
      wide = (SIGNED if dt.kind == "i" else UNSIGNED)[2 * size]
      return self._binop(p, a, lambda x, y: np.asarray(x).astype(wide) * np.asarray(y).astype(wide))
    if "hi" in p: return self._binop(p, a, lambda x, y: _mulhi(x, y, dt))
    return _wrapping(self._binop(p, a, _mul))

  def c_mad(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    if t in FLOATS: return self.c_fma(p, a)
    dt, size = np_type(t), np_type(t).itemsize
    if "wide" in p:
      wide = (SIGNED if dt.kind == "i" else UNSIGNED)[2 * size]
      x0, x1, x2 = self.src(a[1], t), self.src(a[2], t), self.src(a[3], f"{'s' if dt.kind == 'i' else 'u'}{16 * size}")
      w = self.writer(a[0])
      return lambda c, m: w(c, np.asarray(x0(c.R)).astype(wide) * np.asarray(x1(c.R)).astype(wide) + x2(c.R), m)
    if "hi" in p: return self._binop(p, a, lambda x, y, z: _mulhi(x, y, dt) + z, 3)
    return self._binop(p, a, lambda x, y, z: x * y + z, 3)

  def c_fma(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    if t == "f32":
      def f(x: Any, y: Any, z: Any) -> Any:
        return round_odd_to_f32(np.asarray(x, np.float64) * np.asarray(y, np.float64), np.asarray(z, np.float64))
      return self._float(p, a, f, 3)
    if t == "f64":
      return self._float(p, a, lambda x, y, z: fma64(*np.broadcast_arrays(np.asarray(x), np.asarray(y),
                                                                          np.asarray(z))), 3)
    return self._float(p, a, lambda x, y, z: x * y + z, 3)

  def c_div(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    if t in FLOATS: return self._float(p, a, lambda x, y: x / y)
    dt = np_type(t)
    return self._binop(p, a, lambda x, y: _idiv(x, y, dt))

  def c_rem(self, p: list[str], a: list[str]) -> Callable:
    dt = np_type(p[-1])
    return self._binop(p, a, lambda x, y: _irem(x, y, dt))

  def c_min(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, np.fmin)
    return self._binop(p, a, np.minimum)

  def c_max(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, np.fmax)
    return self._binop(p, a, np.maximum)

  def c_abs(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, np.abs, 1)
    return self._binop(p, a, np.abs, 1)

  def c_neg(self, p: list[str], a: list[str]) -> Callable:
    if p[-1] in FLOATS: return self._float(p, a, np.negative, 1)
    return self._binop(p, a, _quiet(np.negative), 1)

  def c_rcp(self, p: list[str], a: list[str]) -> Callable: return self._float(p, a, lambda x: 1 / x, 1)
  def c_sqrt(self, p: list[str], a: list[str]) -> Callable: return self._float(p, a, np.sqrt, 1)

  def c_rsqrt(self, p: list[str], a: list[str]) -> Callable:
    return self._float(p, a, lambda x: (1 / np.sqrt(np.asarray(x, np.float64))).astype(np.asarray(x).dtype), 1)

  def _transc(self, p: list[str], a: list[str], f: Callable) -> Callable:
    return self._float(p, a, lambda x: f(np.asarray(x, np.float64)).astype(np.asarray(x).dtype), 1)

  def c_ex2(self, p: list[str], a: list[str]) -> Callable: return self._transc(p, a, np.exp2)
  def c_lg2(self, p: list[str], a: list[str]) -> Callable: return self._transc(p, a, np.log2)
  def c_sin(self, p: list[str], a: list[str]) -> Callable: return self._transc(p, a, np.sin)
  def c_cos(self, p: list[str], a: list[str]) -> Callable: return self._transc(p, a, np.cos)
  def c_tanh(self, p: list[str], a: list[str]) -> Callable: return self._transc(p, a, np.tanh)

  def c_copysign(self, p: list[str], a: list[str]) -> Callable:
    return self._binop(p, a, lambda x, y: np.copysign(y, x))  # copysign d, a, b: b with the sign of a

  def _bits(self, p: list[str], a: list[str], f: Callable, nsrc: int = 2) -> Callable:
    t = p[-1]
    if t == "pred": return self._binop(p, a, f, nsrc)
    u = "u" + t[1:] if t[0] in "bs" else t
    return self._binop([*p[:-1], u], a, f, nsrc)

  def c_and(self, p: list[str], a: list[str]) -> Callable: return self._bits(p, a, lambda x, y: x & y)
  def c_or(self, p: list[str], a: list[str]) -> Callable: return self._bits(p, a, lambda x, y: x | y)
  def c_xor(self, p: list[str], a: list[str]) -> Callable: return self._bits(p, a, lambda x, y: x ^ y)
  def c_not(self, p: list[str], a: list[str]) -> Callable: return self._bits(p, a, lambda x: ~x, 1)

  def c_cnot(self, p: list[str], a: list[str]) -> Callable:
    return self._bits(p, a, lambda x: (np.asarray(x) == 0).astype(np.asarray(x).dtype), 1)

  def c_popc(self, p: list[str], a: list[str]) -> Callable:
    x0, w = self.src(a[1], "u" + p[-1][1:]), self.writer(a[0])
    return lambda c, m: w(c, _popcount(np.asarray(x0(c.R))), m)

  def c_clz(self, p: list[str], a: list[str]) -> Callable:
    bits = int(p[-1][1:])
    x0, w = self.src(a[1], "u" + p[-1][1:]), self.writer(a[0])

    def f(c: Any, m: Any) -> None:
      x = np.asarray(x0(c.R)).astype(np.float64 if bits == 32 else np.longdouble)
      n = np.where(x == 0, bits, bits - 1 - np.floor(np.log2(np.where(x == 0, 1, x))))
      w(c, n.astype(np.uint32), m)
    return f

  def c_shl(self, p: list[str], a: list[str]) -> Callable:
    t = "u" + p[-1][1:]
    bits = np_type(t).itemsize * 8
    x0, s0, w = self.src(a[1], t), self.src(a[2], "u32"), self.writer(a[0])

    def f(c: Any, m: Any) -> None:
      x, s = np.asarray(x0(c.R)), np.asarray(s0(c.R))
      r = x << np.minimum(s, bits - 1).astype(x.dtype)
      w(c, np.where(s >= bits, x.dtype.type(0), r), m)
    return f

  def c_shr(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1] if p[-1][0] in "su" else "u" + p[-1][1:]
    bits = np_type(t).itemsize * 8
    x0, s0, w = self.src(a[1], t), self.src(a[2], "u32"), self.writer(a[0])

    def f(c: Any, m: Any) -> None:
      x, s = np.asarray(x0(c.R)), np.asarray(s0(c.R))
      r = x >> np.minimum(s, bits - 1).astype(x.dtype)  # a signed shift by bits-1 is already all sign bits
      w(c, r if t[0] == "s" else np.where(s >= bits, x.dtype.type(0), r), m)
    return f

  def c_setp(self, p: list[str], a: list[str]) -> Callable:
    cmp, t = p[1], p[-1]
    combine = p[2] if len(p) > 3 and p[2] in ("and", "or", "xor") else None
    isf = t in FLOATS
    if t in ("b16", "b32", "b64"): t = "u" + t[1:]
    f = _cmp(cmp, isf, p)
    x0, x1 = self.src(a[1], t), self.src(a[2], t)
    dests = a[0].split("|")
    w = self.writer(dests[0])
    wn = self.writer(dests[1]) if len(dests) > 1 else None
    cb = self.src(a[3], "pred") if combine else None
    op = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.get(combine or "", None)

    def fn(c: Any, m: Any) -> None:
      with np.errstate(invalid="ignore"): r = f(x0(c.R), x1(c.R))
      if cb is not None and op is not None:
        q = cb(c.R)
        r, rn = op(r, q), op(~np.asarray(r), q)
      else: rn = ~np.asarray(r)
      w(c, r, m)
      if wn is not None: wn(c, rn, m)
    return fn

  def c_selp(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    x0, x1, q, w = self.src(a[1], t), self.src(a[2], t), self.src(a[3], "pred"), self.writer(a[0])
    return _spec(lambda c, m: w(c, np.where(q(c.R), x0(c.R), x1(c.R)), m), _selp, [x0, x1, q], w)

  def c_slct(self, p: list[str], a: list[str]) -> Callable:
    t, ct = p[-2], p[-1]
    x0, x1, q, w = self.src(a[1], t), self.src(a[2], t), self.src(a[3], ct), self.writer(a[0])
    return lambda c, m: w(c, np.where(np.asarray(q(c.R)) >= 0, x0(c.R), x1(c.R)), m)

  def c_mov(self, p: list[str], a: list[str]) -> Callable:
    t = p[-1]
    if a[0].startswith("{"):  # unpack: the first register gets the low bits
      outs = [self.writer(x) for x in _vec(a[0])]
      x0 = self.src(a[1], "u" + t[1:] if t[0] == "b" else t)
      bits = np_type(t).itemsize * 8 // len(outs)
      part = UNSIGNED[bits // 8]

      def unpack(c: Any, m: Any) -> None:
        x = np.asarray(x0(c.R))
        for j, o in enumerate(outs): o(c, (x >> x.dtype.type(bits * j)).astype(part), m)
      return unpack
    if a[1].startswith("{"):
      ins = _vec(a[1])
      bits = np_type(t).itemsize * 8 // len(ins)
      srcs = [self.src(x, f"b{bits}") for x in ins]
      wide = UNSIGNED[np_type(t).itemsize]
      out = self.writer(a[0])

      def pack(c: Any, m: Any) -> None:
        acc = np.asarray(srcs[0](c.R)).astype(wide)
        for j, s in enumerate(srcs[1:], 1): acc = acc | (np.asarray(s(c.R)).astype(wide) << wide.type(bits * j))
        out(c, acc, m)
      return pack
    x0, w = self.src(a[1], t), self.writer(a[0])
    return _spec(lambda c, m: w(c, x0(c.R), m), _same, [x0], w)

  def c_cvta(self, p: list[str], a: list[str]) -> Callable:
    space = p[2] if p[1] == "to" else p[1]
    x0, w = self.src(a[1], p[-1]), self.writer(a[0])
    if space == "global": return _spec(lambda c, m: w(c, x0(c.R), m), _same, [x0], w)
    win = np.uint64(SHARED_WINDOW if space == "shared" else LOCAL_WINDOW)
    if space not in ("shared", "local"): raise NotImplementedError(f"PTX executor: {'.'.join(p)}")
    if p[1] == "to": return lambda c, m: w(c, np.asarray(x0(c.R)).astype(np.uint64) - win, m)
    return lambda c, m: w(c, np.asarray(x0(c.R)).astype(np.uint64) + win, m)

  def c_cvt(self, p: list[str], a: list[str]) -> Callable:
    mods = [x for x in p[1:-2]]
    dt_s, st_s = p[-2], p[-1]
    x0, w = self.src(a[1], st_s), self.writer(a[0])
    f = _cvt_fn(dt_s, st_s, mods, ".".join(p))
    return _spec(lambda c, m: w(c, f(np.asarray(x0(c.R))), m), lambda x: f(np.asarray(x)), [x0], w)

  def c_testp(self, p: list[str], a: list[str]) -> Callable:
    kind, t = p[1], p[-1]
    tests: dict[str, Callable[[Any], Any]] = {"finite": np.isfinite, "infinite": np.isinf,
                                              "number": lambda x: ~np.isnan(x), "notanumber": np.isnan}
    f = tests.get(kind)
    if f is None: raise NotImplementedError(f"PTX executor: testp.{kind}")
    x0, w = self.src(a[1], t), self.writer(a[0])
    return lambda c, m: w(c, f(x0(c.R)), m)

  # ***** memory *****
  def _mem_parts(self, p: list[str]) -> tuple[str, int, str]:
    space, vec = "generic", 1
    for x in p[1:-1]:
      if x in ("global", "shared", "local", "param", "const"): space = x
      elif x in ("v2", "v4", "v8"): vec = int(x[1:])
      elif x.startswith(("L1::", "L2::", "L2")) or x in _SKIP_MODS: pass
      else: raise NotImplementedError(f"PTX executor: modifier .{x} in {'.'.join(p)}")
    return space, vec, p[-1]

  def c_ld(self, p: list[str], a: list[str]) -> Callable:
    space, vec, t = self._mem_parts(p)
    dt = np_type(t)
    dests = _vec(a[0]) if vec > 1 else [a[0]]
    outs = [self.sub_writer(d) for d in dests]
    if space == "param":
      base, off, sym = self.address(a[1])
      if sym is None: raise NotImplementedError(f"PTX executor: ld.param from {a[1]!r}")
      where = self.params[sym].offset + off
      wd = [self.writer(d) for d in dests]

      def ldp(c: Any, m: Any) -> None:
        vals = np.frombuffer(c.params, dt, count=vec, offset=where)
        for j, o in enumerate(wd): o(c, vals[j], m)
      return ldp
    base, off, _ = self.address(a[1])
    offv = np.uint64(off & 0xFFFFFFFFFFFFFFFF)

    def ld(c: Any, m: Any) -> None:
      addrs = np.asarray(base(c.R)).astype(np.uint64) + offv
      if addrs.shape != (c.L,): addrs = np.broadcast_to(addrs, (c.L,))
      vals = c.load(space, addrs if m is None else addrs[m], dt, vec, m)
      for j, o in enumerate(outs): o(c, vals[:, j], m)
    return ld

  def c_st(self, p: list[str], a: list[str]) -> Callable:
    space, vec, t = self._mem_parts(p)
    srcs = [self.src(x, t) for x in (_vec(a[1]) if vec > 1 else [a[1]])]
    base, off, _ = self.address(a[0])
    offv = np.uint64(off & 0xFFFFFFFFFFFFFFFF)
    if space == "param": raise NotImplementedError("PTX executor: st.param (function calls)")

    def st(c: Any, m: Any) -> None:
      addrs = np.asarray(base(c.R)).astype(np.uint64) + offv
      if addrs.shape != (c.L,): addrs = np.broadcast_to(addrs, (c.L,))
      vals = np.stack([np.broadcast_to(np.asarray(s(c.R)), (c.L,)) for s in srcs], axis=1)
      if m is not None: addrs, vals = addrs[m], vals[m]
      c.store(space, addrs, vals, m)
    return st

  def c_atom(self, p: list[str], a: list[str], ret: bool = True) -> Callable:
    space, op, t = "generic", None, p[-1]
    for x in p[1:-1]:
      if x in ("global", "shared"): space = x
      elif x in ("add", "min", "max", "exch", "cas", "and", "or", "xor", "inc", "dec"): op = x
      elif x not in _SKIP_MODS and x not in ("noftz",): raise NotImplementedError(f"PTX executor: {'.'.join(p)}")
    if op is None: raise NotImplementedError(f"PTX executor: {'.'.join(p)} has no operation")
    dt = np_type("u" + t[1:] if t[0] == "b" else t)
    args = a if ret else ["", *a]
    base, off, _ = self.address(args[1])
    offv = np.uint64(off & 0xFFFFFFFFFFFFFFFF)
    b = self.src(args[2], t)
    cc = self.src(args[3], t) if op == "cas" else None
    w = self.sub_writer(args[0]) if ret else None

    def atom(c: Any, m: Any) -> None:
      addrs = np.broadcast_to(np.asarray(base(c.R)).astype(np.uint64) + offv, (c.L,))
      bv = np.broadcast_to(np.asarray(b(c.R)).astype(dt), (c.L,))
      cv = np.broadcast_to(np.asarray(cc(c.R)).astype(dt), (c.L,)) if cc is not None else None
      if m is not None: addrs, bv, cv = addrs[m], bv[m], (cv[m] if cv is not None else None)
      old = c.atomic(space, op, addrs, bv, cv, dt, m)
      if w is not None: w(c, old, m)
    return atom

  def c_red(self, p: list[str], a: list[str]) -> Callable: return self.c_atom(p, a, ret=False)

  def c_mma(self, p: list[str], a: list[str]) -> Callable: return mma.compile_mma(self, p, a)


def _tag(fn: Any, what: Any) -> Any:
  """Attach what a reader reads (`.src`: ("reg", index, "same"/"view"/"conv"/"not", read dtype, register dtype) or
  ("imm", value)) or a writer writes (`.dst`: (index, register dtype)) to it, for blocks.py."""
  if what and what[0] in ("reg", "imm"): fn.src = what
  else: fn.dst = what
  return fn


def _spec(fn: Any, f: Callable[..., Any], srcs: list[Any], w: Any) -> Any:
  """Mark an instruction closure `fn` as `w(c, f(*sources), m)` (`.spec`), which blocks.py can write inline."""
  fn.spec = (f, srcs, w)
  return fn


def _wrapping(fn: Any) -> Any:
  """Mark an integer add/sub/mul.lo closure: its result bits don't depend on the operands' signedness (arithmetic
  modulo 2**bits), so blocks.py may compute it in the registers' own unsigned type, without reinterpreting views."""
  fn.wrapping = True
  return fn


def _same(x: Any) -> Any: return x
def _add(x: Any, y: Any) -> Any: return x + y
def _sub(x: Any, y: Any) -> Any: return x - y
def _mul(x: Any, y: Any) -> Any: return x * y


OPERATORS = {_add: "+", _sub: "-", _mul: "*"}  # ops blocks.py may write as operators
def _selp(a: Any, b: Any, q: Any) -> Any: return np.where(q, a, b)


def _popcount(x: np.ndarray) -> np.ndarray:
  """Set bits per element (numpy >= 2 has bitwise_count; else through unpackbits)."""
  if hasattr(np, "bitwise_count"): return np.bitwise_count(x).astype(np.uint32)
  return np.unpackbits(x.reshape(-1, 1).view(np.uint8), axis=1).sum(axis=1).astype(np.uint32)


def _vec(tok: str) -> list[str]: return [x.strip() for x in tok.strip().strip("{}").split(",")]


def _quiet(f: Callable) -> Callable:
  """Ops run inside the launch's `np.errstate(all="ignore")` (executor.Kernel.launch): nothing to add per op."""
  return f


def _mulhi(x: Any, y: Any, dt: np.dtype) -> Any:
  x, y = np.asarray(x), np.asarray(y)
  size = dt.itemsize
  if size < 8:
    wide = (SIGNED if dt.kind == "i" else UNSIGNED)[2 * size]
    return ((x.astype(wide) * y.astype(wide)) >> wide.type(8 * size)).astype(dt)
  # 64 x 64 -> high 64 bits from 32-bit halves (unsigned), then the signed correction
  ux, uy = x.view(np.uint64) if x.dtype != np.uint64 else x, y.view(np.uint64) if y.dtype != np.uint64 else y
  m32 = np.uint64(0xFFFFFFFF)
  xl, xh, yl, yh = ux & m32, ux >> np.uint64(32), uy & m32, uy >> np.uint64(32)
  ll, lh, hl, hh = xl * yl, xl * yh, xh * yl, xh * yh
  mid = (ll >> np.uint64(32)) + (lh & m32) + (hl & m32)
  hi = hh + (lh >> np.uint64(32)) + (hl >> np.uint64(32)) + (mid >> np.uint64(32))
  if dt.kind == "i":
    hi = hi - np.where(x < 0, uy, np.uint64(0)) - np.where(y < 0, ux, np.uint64(0))
  return hi.view(dt) if dt != np.uint64 else hi


def _idiv(x: Any, y: Any, dt: np.dtype) -> Any:
  """Integer division truncating toward zero; x / 0 is all ones (what NVIDIA GPUs return; PTX leaves it
  machine-specific)."""
  x, y = np.broadcast_arrays(np.asarray(x, dt), np.asarray(y, dt))
  zero = y == 0
  ys = np.where(zero, dt.type(1), y)
  with np.errstate(all="ignore"):
    r = np.fmod(x, ys)
    q = (x - r) // ys
  return np.where(zero, np.array(-1).astype(dt) if dt.kind == "i" else dt.type(np.iinfo(dt).max), q)


def _irem(x: Any, y: Any, dt: np.dtype) -> Any:
  """Remainder with the sign of the dividend (C's %); x % 0 is x."""
  x, y = np.broadcast_arrays(np.asarray(x, dt), np.asarray(y, dt))
  zero = y == 0
  with np.errstate(all="ignore"): r = np.fmod(x, np.where(zero, dt.type(1), y))
  return np.where(zero, x, r)


def _cmp(cmp: str, isf: bool, p: list[str]) -> Callable:
  ordered = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
             "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
  if cmp in ordered:
    f = ordered[cmp]
    if isf and cmp == "ne": return lambda x, y: np.not_equal(x, y) & ~np.isnan(x) & ~np.isnan(y)
    return f
  if isf and cmp.endswith("u") and cmp[:-1] in ordered:
    g = ordered[cmp[:-1]]
    return lambda x, y: g(x, y) | np.isnan(x) | np.isnan(y)
  if isf and cmp == "num": return lambda x, y: ~np.isnan(x) & ~np.isnan(y)
  if isf and cmp == "nan": return lambda x, y: np.isnan(x) | np.isnan(y)
  raise NotImplementedError(f"PTX executor: comparison {'.'.join(p)}")


def _cvt_fn(d: str, s: str, mods: list[str], name: str) -> Callable[[Any], Any]:
  """The conversion `cvt{mods}.d.s` on a lane column (PTX ISA "cvt": float->int saturates, NaN -> 0)."""
  ddt = np_type(d)
  rnd = next((x for x in mods if x in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")), None)
  sat = "sat" in mods
  flush = "ftz" in mods
  sflt, dflt = s in FLOATS or s == "bf16", d in FLOATS or d == "bf16"

  def src_val(x: Any) -> Any:
    if s == "bf16": return bf16_to_f32(x)
    return ftz(x) if flush and s == "f32" else x

  if sflt and dflt:
    if rnd in ("rz", "rm", "rp"): raise NotImplementedError(f"PTX executor: {name}")
    rint = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}.get(rnd or "")

    def ff(x: Any) -> Any:
      v = src_val(x)
      if rint is not None: v = rint(v)
      if d == "bf16": return f32_to_bf16(np.asarray(v, np.float32) if s != "f64" else _f64_to_f32_odd(v))
      with np.errstate(over="ignore"): r = np.asarray(v).astype(ddt)
      if sat: r = np.where(np.isnan(r), ddt.type(0), np.clip(r, 0, 1)).astype(ddt)
      return ftz(r) if flush and d == "f32" else r
    return ff
  if sflt:  # float -> int: round, saturate to the destination range, NaN -> 0
    if rnd not in ("rni", "rzi", "rmi", "rpi"): raise NotImplementedError(f"PTX executor: {name} needs .rXi")
    f = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rnd]
    info = np.iinfo(ddt)

    def fi(x: Any) -> Any:
      v = f(np.asarray(src_val(x), np.float64))
      with np.errstate(invalid="ignore"):
        out = np.clip(np.nan_to_num(v, nan=0.0), float(info.min), float(info.max))
        r = out.astype(ddt)
        if ddt.itemsize == 8:  # float64(max) rounds up to 2**63 / 2**64: pin the top to the maximum
          r = np.where(out >= float(info.max), ddt.type(info.max), r)
      return r
    return fi
  sdt = np_type(s)
  if dflt:
    if rnd in ("rz", "rm", "rp"): raise NotImplementedError(f"PTX executor: {name}")

    def if_(x: Any) -> Any:
      if d == "bf16": return f32_to_bf16(np.asarray(x).astype(np.float64).astype(np.float32))
      return np.asarray(x).astype(ddt)
    return if_

  def ii(x: Any) -> Any:
    v = np.asarray(x).astype(sdt, copy=False)
    if sat:
      info = np.iinfo(ddt)
      return np.clip(v.astype(np.float64), info.min, info.max).astype(ddt)
    return v.astype(ddt)
  return ii


def _f64_to_f32_odd(v: Any) -> Any:
  return round_odd_to_f32(np.asarray(v, np.float64), np.zeros_like(np.asarray(v, np.float64)))
