"""Opts and their application: a kernel AST's loops split and re-marked, with validity checks.

A kernel's *axes* are its RANGEs. Output axes (LOOP/GLOBAL/LOCAL/UPCAST/THREAD) and reduce axes
(REDUCE/GROUP_REDUCE/UNROLL) are numbered separately, each in axis-id order:
  UPCAST, LOCAL, PADTO, THREAD, TILE     `axis` counts output axes
  UNROLL, GROUP, GROUPTOP                `axis` counts reduce axes
An opt with `arg=amt` splits axis `r` (bound N) into `outer` (N/amt, keeps its type) and `inner` (amt, the new type):
`r -> outer*amt + inner` (GROUPTOP puts the new range outside: `r -> inner*(N/amt) + outer`). `arg=0` means the
whole axis. TILE's inner range is a LOOP with the newest id, so it nests inside every other output loop (loops nest
by type, then id): the axes after `r` run over one tile of `amt` iterations of `r` at a time, which stays in cache
(CPU renderers only; a GPU's output axes are launch dims). NOLOCALS forbids LOCAL afterwards. PADTO pads an
axis up to a multiple of `arg` and masks the extra iterations. An axis of symbolic bound B splits only by UPCAST of
an explicit amount (`_split_tail`): outer over ceil(B/amt), every store gated by `outer*amt + inner < B`, every
load reading the last valid row (its index clamped to B - 1) past it (on a vectorizing renderer the expander turns
a load contiguous along that axis into a masked vector load instead, PIPELINE.md §3).
TC (`axis`: which matmul of `tc_candidates`, `arg`: tc_select, -1 = the first tensor core whose dtypes fit) maps a
REDUCE-ADD of `CAST(a*b)` (or `CAST(a)*CAST(b)`) onto the renderer's tensor core: one warp computes one output tile
(see `_tc_rewrite`). It must be the first opt, and no opt applies after it. Each tensor core's layout -- which tile
element every lane holds in its A/B/C fragments -- is a function in `TC_FRAGMENTS`, chosen by `tc.opts[0]`: PTX
`mma.sync` m16n8k16/m16n8k8, RDNA3 wave32 `v_wmma_f32_16x16x16_{f16,bf16}` and CDNA wave64
`v_mfma_f32_16x16x16_{f16,bf16}`, with half/bfloat16 inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from functools import partial
from typing import Any, Callable

from tiny_uop.device import Renderer
from tiny_uop.dtype import DType, PtrDType, dtypes
from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp


class OptOps(Enum):
  """The optimizations a kernel accepts."""
  UPCAST = auto(); UNROLL = auto(); LOCAL = auto(); GROUP = auto(); GROUPTOP = auto()  # noqa: E702
  NOLOCALS = auto(); PADTO = auto(); TC = auto(); THREAD = auto(); TILE = auto()  # noqa: E702

  def __repr__(self) -> str: return f"OptOps.{self.name}"


@dataclass(frozen=True, order=True)
class Opt:
  """One optimization: `op` on `axis` with `arg` (an amount; 0 = the whole axis)."""
  op: OptOps
  axis: int | None = None
  arg: int | tuple | None = None

  def __repr__(self) -> str: return f"Opt(op={self.op!r}, axis={self.axis}, arg={self.arg})"


MAX_LANES = 1024  # UPCAST x UNROLL lanes per kernel: beyond, the straight-line body only slows compiling (a CPU's
                  # vector axis makes 16 lanes one register, so a 16x4x2 block unrolled 5 times is still small)


class KernelOptError(ValueError):
  """An opt that can't apply to this kernel; the message says why and what would be valid."""


OUTPUT_TYPES = (AxisType.LOOP, AxisType.GLOBAL, AxisType.LOCAL, AxisType.UPCAST, AxisType.THREAD)
REDUCE_TYPES = (AxisType.REDUCE, AxisType.GROUP_REDUCE, AxisType.UNROLL)
_SPLITTABLE_OUT = (AxisType.LOOP, AxisType.GLOBAL, AxisType.THREAD)
_NEW_TYPE = {OptOps.UPCAST: AxisType.UPCAST, OptOps.UNROLL: AxisType.UNROLL, OptOps.LOCAL: AxisType.LOCAL,
             OptOps.GROUP: AxisType.GROUP_REDUCE, OptOps.GROUPTOP: AxisType.GROUP_REDUCE,
             OptOps.THREAD: AxisType.THREAD, OptOps.TILE: AxisType.LOOP}


def _bound(r: UOp) -> int | None:
  return int(r.src[0].arg) if r.src[0].op is Ops.CONST else None


class Kernel:
  """A kernel AST being optimized for one renderer: `apply_opt` returns nothing and updates `self.ast`."""

  def __init__(self, ast: UOp, renderer: Renderer):
    if ast.op is not Ops.SINK: raise KernelOptError(f"a kernel AST is a SINK, got {ast.op}")
    self.ast, self.renderer = ast, renderer
    self.applied_opts: list[Opt] = []
    self.dont_use_locals = isinstance(ast.arg, KernelInfo) and ast.arg.dont_use_locals

  # ***** the axes *****
  @property
  def rngs(self) -> list[UOp]:
    return sorted({u: None for u in self.ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])

  @property
  def output_axes(self) -> list[UOp]: return [r for r in self.rngs if r.arg[1] in OUTPUT_TYPES]

  @property
  def reduce_axes(self) -> list[UOp]: return [r for r in self.rngs if r.arg[1] in REDUCE_TYPES]

  @property
  def upcast_size(self) -> int:
    n = 1
    for r in self.rngs:
      if r.arg[1] in (AxisType.UPCAST, AxisType.UNROLL): n *= _bound(r) or 1
    return n

  def loads(self) -> list[UOp]:
    return [u for u in self.ast.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and
            u.src[0].src[0].op is Ops.PARAM]

  def stores(self) -> list[UOp]: return [u for u in self.ast.toposort() if u.op is Ops.STORE]

  def copy(self) -> Kernel:
    k = Kernel(self.ast, self.renderer)
    k.applied_opts = list(self.applied_opts)
    k.dont_use_locals = self.dont_use_locals
    return k

  # ***** applying *****
  def _axis(self, opt: Opt) -> UOp:
    reduce_side = opt.op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP)
    axes = self.reduce_axes if reduce_side else self.output_axes
    kind = "reduce" if reduce_side else "output"
    if not isinstance(opt.axis, int) or not 0 <= opt.axis < len(axes):
      raise KernelOptError(f"{opt}: axis {opt.axis} doesn't exist; this kernel has {len(axes)} {kind} axes "
                           f"{[(r.arg[0], r.arg[1].name, _bound(r)) for r in axes]}")
    return axes[opt.axis]

  def apply_opt(self, opt: Opt) -> None:
    """Apply `opt`, or raise KernelOptError (the kernel is unchanged then)."""
    if opt.op is OptOps.NOLOCALS:
      if any(r.arg[1] is AxisType.LOCAL for r in self.rngs): raise KernelOptError("NOLOCALS after LOCAL was applied")
      self.dont_use_locals = True
    elif opt.op is OptOps.TC: self._tc(opt)
    elif any(o.op is OptOps.TC for o in self.applied_opts):
      raise KernelOptError(f"{opt}: no opts apply after TC (its warp tile fixes the kernel's axes)")
    elif opt.op is OptOps.PADTO: self._padto(opt)
    else: self._split(opt)
    self.applied_opts.append(opt)

  def _check(self, opt: Opt, r: UOp) -> int:
    n = _bound(r)
    if n is None: return self._check_tail(opt, r)
    amt = opt.arg if opt.arg else n
    if not isinstance(amt, int) or amt <= 1:
      raise KernelOptError(f"{opt}: amount must be an int > 1 (or 0 = whole), got {amt}")
    if n % amt != 0: raise KernelOptError(f"{opt}: axis {opt.axis} of size {n} is not divisible by {amt}")
    ren, t = self.renderer, r.arg[1]
    if opt.op is OptOps.TILE and ren.has_local:
      raise KernelOptError(f"{opt}: TILE nests CPU loops; {type(ren).__name__}'s output axes are launch dims")
    if opt.op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD, OptOps.TILE) and t not in _SPLITTABLE_OUT:
      raise KernelOptError(f"{opt}: axis {opt.axis} is already {t.name}; {opt.op.name} splits LOOP/GLOBAL axes")
    if opt.op is OptOps.UNROLL and t is not AxisType.REDUCE:
      raise KernelOptError(f"{opt}: axis {opt.axis} is {t.name}; UNROLL splits REDUCE axes")
    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
      if not ren.has_local or self.dont_use_locals:
        raise KernelOptError(f"{opt}: {type(ren).__name__} has no local (workgroup) dims" if not ren.has_local else
                             f"{opt}: NOLOCALS was applied")
      if opt.op is not OptOps.LOCAL and not ren.has_shared:
        raise KernelOptError(f"{opt}: {type(ren).__name__} has no shared memory for a grouped reduce")
      if opt.op is not OptOps.LOCAL and t is not AxisType.REDUCE:
        raise KernelOptError(f"{opt}: axis {opt.axis} is {t.name}; GROUP splits REDUCE axes")
      local_total = amt
      for x in self.rngs:
        if x.arg[1] in (AxisType.LOCAL, AxisType.GROUP_REDUCE): local_total *= _bound(x) or 1
      limit = ren.max_workgroup_size or (max(ren.local_max) if ren.local_max is not None else None)
      if limit is not None and local_total > limit:
        raise KernelOptError(f"{opt}: {local_total} threads per workgroup exceeds the renderer's limit {limit}")
    if opt.op is OptOps.THREAD and not ren.has_threads:
      raise KernelOptError(f"{opt}: {type(ren).__name__} doesn't split kernels across CPU threads")
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL) and self.upcast_size * amt > MAX_LANES:
      raise KernelOptError(f"{opt}: upcasting to {self.upcast_size * amt} lanes exceeds the limit of {MAX_LANES}")
    return amt

  def _check_tail(self, opt: Opt, r: UOp) -> int:
    """The amount of `opt` on axis `r` of a symbolic bound: only UPCAST of a LOOP/GLOBAL output axis that every
    store depends on, by an explicit amount, splits it (`_split_tail`: a masked tail)."""
    if opt.op is not OptOps.UPCAST or r.arg[1] not in (AxisType.LOOP, AxisType.GLOBAL):
      raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic bound {r.src[0].render()}; only UPCAST of a "
                           "LOOP/GLOBAL output axis splits a symbolic bound (with a masked tail)")
    if not isinstance(opt.arg, int) or opt.arg <= 1:
      raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic bound {r.src[0].render()}: the amount must be an "
                           f"explicit int > 1 (not 0 = whole), got {opt.arg}")
    if any(r not in st.src[0].ranges for st in self.stores()):
      raise KernelOptError(f"{opt}: a store doesn't depend on symbolic axis {opt.axis}; its masked tail would not "
                           "mask that store")
    if self.upcast_size * opt.arg > MAX_LANES:
      raise KernelOptError(f"{opt}: upcasting to {self.upcast_size * opt.arg} lanes exceeds the limit of {MAX_LANES}")
    return opt.arg

  def _split_tail(self, opt: Opt, r: UOp, amt: int) -> None:
    """UPCAST output axis `r` of symbolic bound B by `amt`: r -> outer*amt + inner, outer over ceil(B / amt)
    (its bound computed at run time), so the last block's lanes past B store nothing (correct for every value of
    B, 1 and those not divisible by `amt` included):
    - every store through `r` is gated by `outer*amt + inner < B`;
    - every load through `r` reads with `r` clamped to B - 1 past it, the last valid row: an address some valid lane
      reads too, so in bounds, and what it feeds is only stored by lanes the gate lets through, since every store
      depends on `r` (`_check_tail`). The clamp is invariant in the loops inside the block, where a gated load would
      test its gate at every load (a matmul's rows, masked per load inside the K loop, ran 3x slower than a fixed
      size's on a Xeon 6/207, AVX-512: LLVM rematerialized the eight row masks in every iteration).
    Other uses of `r` (values computed from the index, a causal mask's row) see `outer*amt + inner` itself."""
    bound = r.src[0]
    inner = UOp.range(amt, max(x.arg[0] for x in self.rngs) + 1, AxisType.UPCAST, r.dtype)
    outer = UOp(Ops.RANGE, r.dtype, ((bound + (amt - 1)) // amt,), r.arg)
    expr = outer * amt + inner
    valid = expr < bound
    clamped = valid.where(expr, bound - 1)
    loads = {u: u.replace(src=(u.src[0].substitute({r: clamped}, name="tail_clamp"), *u.src[1:]))
             for u in self.ast.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and r in u.src[0].ranges}
    ast = self.ast.substitute(loads, name="tail_clamp") if loads else self.ast
    gates: dict[UOp, UOp] = {}
    for u in ast.toposort():
      if u.op is Ops.INDEX and r in u.ranges:
        gates[u] = u.replace(src=(u.src[0], u.src[1], valid & u.src[2]) if len(u.src) > 2 else (*u.src, valid))
    ast = ast.substitute(gates, name="tail_mask") if gates else ast
    self.ast = replace_range(ast, r, expr, (outer, inner))

  def _split(self, opt: Opt) -> None:
    r = self._axis(opt)
    amt = self._check(opt, r)
    n = _bound(r)
    if n is None: return self._split_tail(opt, r, amt)
    new_id = max(x.arg[0] for x in self.rngs) + 1
    new_type = _NEW_TYPE[opt.op]
    inner = UOp.range(amt, new_id, new_type, r.dtype)
    outer = UOp.range(n // amt, r.arg[0], r.arg[1], r.dtype) if n // amt > 1 else None
    if opt.op is OptOps.GROUPTOP:
      expr = inner * (n // amt) + outer if outer is not None else inner
    else:
      expr = outer * amt + inner if outer is not None else inner
    new_rngs = (outer, inner) if outer is not None else (inner,)
    self.ast = replace_range(self.ast, r, expr, new_rngs)

  def _padto(self, opt: Opt) -> None:
    r = self._axis(opt)
    n = _bound(r)
    if n is None: raise KernelOptError(f"{opt}: axis {opt.axis} has a symbolic bound")
    amt = opt.arg
    if not isinstance(amt, int) or amt <= 1: raise KernelOptError(f"{opt}: PADTO needs an int amount > 1, got {amt}")
    padded = -(-n // amt) * amt
    if padded == n: raise KernelOptError(f"{opt}: axis {opt.axis} of size {n} is already a multiple of {amt}")
    if padded > 2 * n: raise KernelOptError(f"{opt}: padding {n} to {padded} more than doubles the work")
    if any(red.op is Ops.REDUCE and red.arg is not Ops.ADD for red in self.ast.toposort() if r in red.ranges):
      raise KernelOptError(f"{opt}: PADTO under a MUL/MAX reduce would change its result")
    new_r = UOp.range(padded, r.arg[0], r.arg[1], r.dtype)
    valid = new_r < n
    subs: dict[UOp, UOp] = {}
    for u in self.ast.toposort():  # every memory access through the padded range gets masked
      if u.op is Ops.INDEX and r in u.ranges:
        subs[u] = u.replace(src=(u.src[0], u.src[1], valid & u.src[2]) if len(u.src) > 2 else (*u.src, valid))
    ast = self.ast.substitute(subs, name="padto_mask") if subs else self.ast
    self.ast = replace_range(ast, r, new_r, (new_r,))

  # ***** tensor cores *****
  def tc_candidates(self) -> list[tuple[UOp, UOp, UOp, UOp, UOp, UOp]]:
    """The (reduce, a, b, m axis, n axis, k axis) matmuls TC can map: a REDUCE-ADD over one REDUCE axis k of
    `CAST(a*b)` or `CAST(a)*CAST(b)`, where `a` depends on output axis m but not n and `b` on n but not m."""
    out = []
    outs = [r for r in self.output_axes if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)]
    for red in self.ast.toposort():
      if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or len(red.src) != 2: continue
      k, v = red.src[1], red.src[0]
      if k.arg[1] is not AxisType.REDUCE: continue
      if v.op is Ops.CAST and v.src[0].op is Ops.MUL: a, b = v.src[0].src
      elif v.op is Ops.MUL and all(x.op is Ops.CAST for x in v.src): a, b = (x.src[0] for x in v.src)
      elif v.op is Ops.MUL: a, b = v.src  # no cast: the dtype check below names what doesn't fit
      else: continue
      if a.dtype != b.dtype or a.dtype.count != 1: continue
      for m in outs:
        for n in outs:
          if m is not n and m in a.ranges and m not in b.ranges and n in b.ranges and n not in a.ranges and \
             k in a.ranges and k in b.ranges: out.append((red, a, b, m, n, k))
    return out

  def _tc(self, opt: Opt) -> None:
    """One warp computes one (M x N) output tile per mma: the m/n/k axes split by the tensor core's dims, a LOCAL
    axis of its 32 lanes, and per lane the A/B fragments gathered (VECTORIZE) in the tensor core's layout; the
    REDUCE of the MUL becomes a vector REDUCE of the WMMA over the outer k, stored per C element through a GEP."""
    ren = self.renderer
    if not ren.tensor_cores: raise KernelOptError(f"{opt}: renderer {type(ren).__name__} has no tensor cores")
    if not ren.has_local or self.dont_use_locals:
      raise KernelOptError(f"{opt}: TC needs local (warp) threads" + (", but NOLOCALS was applied" if ren.has_local
                                                                      else ""))
    if self.applied_opts: raise KernelOptError(f"{opt}: TC must be the first opt, got {self.applied_opts} before it")
    cands = self.tc_candidates()
    if not cands: raise KernelOptError(f"{opt}: no REDUCE-ADD of a product of two operands, each independent of one "
                                       "output axis (a matmul), in this kernel")
    axis = opt.axis or 0
    if not 0 <= axis < len(cands): raise KernelOptError(f"{opt}: axis {axis} out of range; {len(cands)} matmul(s)")
    red, a, b, m, n, k = cands[axis]
    sel = opt.arg[0] if isinstance(opt.arg, tuple) else opt.arg
    sel = -1 if sel is None else sel
    if not isinstance(sel, int) or not -1 <= sel < len(ren.tensor_cores):
      raise KernelOptError(f"{opt}: tc_select {sel} invalid; valid: -1 (first that fits) .. {len(ren.tensor_cores)-1}")
    tcs = ren.tensor_cores if sel == -1 else [ren.tensor_cores[sel]]
    fits = [tc for tc in tcs if tc.dtype_in == a.dtype and tc.dtype_out == red.dtype]
    if not fits:
      raise KernelOptError(f"{opt}: inputs {a.dtype.name} accumulating in {red.dtype.name} fit none of the tensor "
                           f"cores {[str(tc) for tc in tcs]}")
    tc = fits[0]
    if not tc.opts or tc.opts[0] not in TC_FRAGMENTS or tc.dtype_in not in (dtypes.float16, dtypes.bfloat16):
      raise KernelOptError(f"{opt}: TC lowering for {tc} {tc.opts} isn't implemented; valid: fragment layouts "
                           f"{sorted(TC_FRAGMENTS)} with half/bfloat16 inputs")
    dn, dm, dk = tc.dims
    for r, d, name in ((m, dm, "M"), (n, dn, "N"), (k, dk, "K")):
      if (sz := _bound(r)) is None or sz % d != 0:
        raise KernelOptError(f"{opt}: {name} axis {r.arg[0]} of size {sz if sz is not None else r.src[0].render()} "
                             f"is not a multiple of {d} ({tc})")
    if len(self.ast.src) != 1 or self.ast.src[0].op is not Ops.STORE or \
       sum(u.op is Ops.REDUCE for u in self.ast.toposort()) != 1:
      raise KernelOptError(f"{opt}: TC needs a kernel of one STORE with one REDUCE")
    self.ast = _tc_rewrite(self.ast, red, a, b, m, n, k, tc, max(x.arg[0] for x in self.rngs) + 1,
                           ren.buffer_align)

  def get_optimized_ast(self) -> UOp:
    """The AST with the opts applied, recorded in its KernelInfo."""
    info = self.ast.arg if isinstance(self.ast.arg, KernelInfo) else KernelInfo()
    new_info = KernelInfo(info.name, info.opts_to_apply, tuple(self.applied_opts), self.dont_use_locals)
    return self.ast.replace(arg=new_info)


def _frag_mma(kdim: int, kind: str, e: int, lane: Any) -> tuple[Any, Any]:
  """(row, col) in its tile of element `e` of `lane`'s `mma.sync.m16n8k{kdim}` fragment (PTX ISA layout: lane =
  g*4 + t; A is M x K row-major, B is K x N column-major, C is M x N)."""
  g, t = lane // 4, lane % 4
  if kind == "a":
    return (g + (8 if e in (2, 3, 6, 7) else 0), t * 2 + (e & 1) + (8 if kdim == 16 and e >= 4 else 0))
  if kind == "b": return (t * 2 + (e & 1) + (8 if kdim == 16 and e >= 2 else 0), g)
  return (g + (8 if e >= 2 else 0), t * 2 + (e & 1))


def _frag_wmma_rdna3(kind: str, e: int, lane: Any) -> tuple[Any, Any]:
  """(row, col) in its tile of element `e` of `lane`'s wave32 `v_wmma_f32_16x16x16_{f16,bf16}` operand (RDNA3 ISA
  section 7.9): A element e of lane l is A[l%16][e] (a row of K), B element e is B[e][l%16] (a column of K) --
  lanes 16-31 repeat lanes 0-15 -- and the float C/D element e is D[2*e + l//16][l%16]."""
  if kind == "a": return (lane % 16, e)
  if kind == "b": return (e, lane % 16)
  return (lane // 16 + 2 * e, lane % 16)


def _frag_mfma_16x16(kind: str, e: int, lane: Any) -> tuple[Any, Any]:
  """(row, col) in its tile of element `e` of `lane`'s wave64 `v_mfma_f32_16x16x16_{f16,bf16}` operand (AMD CDNA3 ISA
  "Matrix fused multiply-add", one block, as AMD's matrix instruction calculator lists it): A element e of lane l is
  A[l%16][4*(l//16) + e] (K split over the four groups of 16 lanes), B element e is B[4*(l//16) + e][l%16], and the
  float C/D element e (VGPR e of the 4) is D[4*(l//16) + e][l%16]."""
  if kind == "a": return (lane % 16, lane // 16 * 4 + e)
  if kind == "b": return (lane // 16 * 4 + e, lane % 16)
  return (lane // 16 * 4 + e, lane % 16)


# tc.opts[0] -> (kind, element, lane) -> (row, col) of the element in its A (M x K), B (K x N) or C (M x N) tile;
# `lane` is the lane RANGE (UOp expressions come back) or a lane number (ints come back)
TC_FRAGMENTS: dict[str, Callable[[str, int, Any], tuple[Any, Any]]] = {
  "mma.m16n8k16": partial(_frag_mma, 16), "mma.m16n8k8": partial(_frag_mma, 8),
  "wmma.16x16x16": _frag_wmma_rdna3, "mfma.16x16x16": _frag_mfma_16x16}


def _bits(x: UOp, dt: DType) -> UOp:
  """`x` (bfloat16) as its `dt` (uint16) bits: a plain load of a buffer reads them straight from the buffer viewed as
  `dt` (as `bf16_to_float` lowers every bf16 pointer), else a BITCAST (which lowers through float32)."""
  if x.op is Ops.LOAD and len(x.src) == 1 and x.src[0].op is Ops.INDEX and x.src[0].src[0].op is Ops.PARAM and \
     isinstance(x.src[0].src[0].dtype, PtrDType):
    idx, p = x.src[0], x.src[0].src[0]
    assert isinstance(p.dtype, PtrDType)
    view = p.replace(dtype=dt.ptr(p.dtype.size, p.dtype.addrspace))
    return UOp(Ops.LOAD, dt, (idx.replace(dtype=view.dtype, src=(view, *idx.src[1:])),))
  return x.bitcast(dt)


def _vector_loads(x: UOp, elems: list[UOp], cells: list[tuple[Any, Any]], threads: int, axes: tuple[UOp, UOp],
                  dims: tuple[int, int], align: int) -> list[UOp]:
  """The fragment `elems` (element e of operand `x` at tile cell `cells[e*threads + lane]` = (row, col), rows along
  `axes[0]`, cols along `axes[1]`) with runs of elements adjacent in memory read by one vector LOAD (GEPs of it):
  `x` must be a plain load at an affine index, the run contiguous in every lane, its first element aligned to the
  run's width for every value of every range, and the run no wider than `align`, the bytes of alignment the renderer
  may assume for a buffer argument."""
  if x.op is not Ops.LOAD or len(x.src) != 1 or x.src[0].op is not Ops.INDEX or len(x.src[0].src) != 2: return elems
  idx = x.src[0].src[1]
  if any(u.op not in (Ops.ADD, Ops.MUL, Ops.CONST, Ops.RANGE) or
         (u.op is Ops.MUL and not any(s.op is Ops.CONST for s in u.src)) for u in idx.toposort()): return elems
  rngs = list(idx.ranges)
  zero = idx.substitute({r: UOp.const(r.dtype, 0) for r in rngs}).simplify() if rngs else idx
  strides = {r: stride_of(idx, r, rngs) for r in rngs}
  if zero.op is not Ops.CONST or any(v is None for v in strides.values()): return elems
  srow, scol = (strides.get(r, 0) for r in axes)
  assert srow is not None and scol is not None
  # the outer tile ranges step by whole tiles; every other range keeps its stride
  steps = [srow * dims[0], scol * dims[1]] + [v for r, v in strides.items() if r not in axes and v is not None]
  addr = [[srow * cells[e * threads + ln][0] + scol * cells[e * threads + ln][1] for ln in range(threads)]
          for e in range(len(elems))]
  base = int(zero.arg)

  def run_ok(e: int, w: int) -> bool:  # elements e..e+w-1: one plain load's neighbours, aligned to w everywhere
    ld = elems[e]
    return ld.op is Ops.LOAD and len(ld.src) == 1 and ld.src[0].op is Ops.INDEX and len(ld.src[0].src) == 2 and \
      all(addr[e + j][ln] == addr[e][ln] + j for j in range(w) for ln in range(threads)) and \
      all((base + addr[e][ln]) % w == 0 for ln in range(threads)) and all(st % w == 0 for st in steps)
  widths = [w for w in (8, 4, 2) if w * x.dtype.itemsize <= align]
  out, e = list(elems), 0
  while e < len(elems):
    w = next((w for w in widths if e + w <= len(elems) and run_ok(e, w)), 1)
    if w > 1:
      vec = UOp(Ops.LOAD, elems[e].dtype.vec(w), elems[e].src)
      out[e:e + w] = [UOp(Ops.GEP, elems[e].dtype, (vec,), (j,)) for j in range(w)]
    e += w
  return out


def _tc_rewrite(ast: UOp, red: UOp, a: UOp, b: UOp, m: UOp, n: UOp, k: UOp, tc: Any, lane_id: int,
                align: int = 0) -> UOp:
  """The one-store kernel `ast` with `red` = REDUCE(a*b, k) computed by tensor core `tc`: m -> mo*M + row,
  n -> no*N + col, k -> ko*K + kk (the outer ranges keep the axis ids, and vanish when the axis is one tile), a new
  LOCAL axis `lane_id` of the warp's lanes, and one store per accumulator element e of the lane's C fragment:
  GEP(REDUCE(WMMA(A fragment, B fragment, 0), ko), e). The vector REDUCE lowers to one vector register accumulator,
  `acc + WMMA(a, b, 0)`, which the GPU renderers' rules fold into `WMMA(a, b, acc)`: the tensor core accumulates.
  Fragment elements adjacent in memory come from one vector LOAD where the renderer assumes buffer arguments aligned
  to `align` bytes (its `buffer_align`; 0: scalar loads only)."""
  dn, dm, dk = tc.dims
  na, nb, nc = tc.elements_per_thread

  def outer(r: UOp, d: int) -> UOp:
    sz = _bound(r)
    assert sz is not None
    return UOp.range(sz // d, r.arg[0], r.arg[1], r.dtype) if sz // d > 1 else UOp.const(r.dtype, 0)
  mo, no, ko = outer(m, dm), outer(n, dn), outer(k, dk)
  lane = UOp.range(tc.threads, lane_id, AxisType.LOCAL, m.dtype)
  frag = TC_FRAGMENTS[tc.opts[0]]

  def at(ro: UOp, d: int, off: UOp | int) -> UOp: return ro * d + off

  fa = [a.substitute({m: at(mo, dm, (rc := frag("a", e, lane))[0]), k: at(ko, dk, rc[1])})
        for e in range(na)]
  fb = [b.substitute({k: at(ko, dk, (rc := frag("b", e, lane))[0]), n: at(no, dn, rc[1])})
        for e in range(nb)]
  # bfloat16 fragments travel as their bits (the renderer computes bf16 through float32 and packs uint16 pairs)
  fdt = dtypes.uint16 if tc.dtype_in == dtypes.bfloat16 else tc.dtype_in
  if fdt != tc.dtype_in: fa, fb = [_bits(x, fdt) for x in fa], [_bits(x, fdt) for x in fb]
  fa = _vector_loads(a, fa, [frag("a", e, ln) for e in range(na) for ln in range(tc.threads)], tc.threads, (m, k),
                     (dm, dk), align)
  fb = _vector_loads(b, fb, [frag("b", e, ln) for e in range(nb) for ln in range(tc.threads)], tc.threads, (k, n),
                     (dk, dn), align)
  zero = UOp(Ops.VECTORIZE, tc.dtype_out.vec(nc), (UOp.const(tc.dtype_out, 0.0),) * nc)
  wmma = UOp(Ops.WMMA, tc.dtype_out.vec(nc), (UOp(Ops.VECTORIZE, fdt.vec(na), tuple(fa)),
                                              UOp(Ops.VECTORIZE, fdt.vec(nb), tuple(fb)), zero),
             arg=(str(tc), tc.dtype_in.name))
  st = ast.src[0]
  stores = []
  acc = UOp(Ops.REDUCE, wmma.dtype, (wmma, ko), Ops.ADD) if ko.op is Ops.RANGE else wmma
  for e in range(nc):
    val = UOp(Ops.GEP, tc.dtype_out, (acc,), (e,))
    row, col = frag("c", e, lane)
    stores.append(st.substitute({red: val}).substitute({m: at(mo, dm, row), n: at(no, dn, col)}))
  return ast.replace(src=tuple(stores))


def replace_range(ast: UOp, r: UOp, expr: UOp, new_rngs: tuple[UOp, ...]) -> UOp:
  """Replace range `r` by the expression `expr` everywhere, and by `new_rngs` in the range lists of REDUCEs."""
  reds = {u: u.replace(src=(u.src[0], *[y for x in u.src[1:] for y in (new_rngs if x is r else (x,))]))
          for u in ast.toposort() if u.op is Ops.REDUCE and r in u.src[1:]}
  if reds: ast = ast.substitute(reds, name="split_reduce_ranges")
  return ast.substitute({r: expr}, name="split_range")


def stride_of(idx: UOp, r: UOp, rngs: list[UOp]) -> int | None:
  """How much `idx` moves when `r` goes up by one (others at 0), or None when that isn't a constant."""
  zero = {x: UOp.const(x.dtype, 0) for x in rngs}
  a = idx.substitute({**zero, r: UOp.const(r.dtype, 1)}).simplify()
  b = idx.substitute(zero).simplify()
  if a.op is Ops.CONST and b.op is Ops.CONST: return int(a.arg) - int(b.arg)
  return None


