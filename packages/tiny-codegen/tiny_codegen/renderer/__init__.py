"""Renderers: linear UOps (docs/PIPELINE.md §4) to source text.

- `cstyle.ClangRenderer`: C for clang/gcc (device CPU, `DEV=CPU:CLANG`), compiled to a shared object.
- `llvmir.LLVMRenderer`: LLVM IR for the host, compiled in-process by llvmlite to an ELF object (the CPU default).

Both use the CPU calling convention `void name(T0* data0, ..., int var0, ..., int core_id)`.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterator, NamedTuple, Sequence, overload

from tiny_uop.device import Renderer
from tiny_uop.dtype import DType, dtypes
from tiny_uop.helpers import CPU_THREADS
from tiny_uop.uop import AXIS_LETTER, AxisType, Ops, UOp

from tiny_codegen.machine import Machine, host_machine

__all__ = ["CPURenderer", "CWriter", "SourceExprs", "RenderError", "ValueNames", "count_uses", "kernel_params",
           "var_args", "var_ident", "OOBCheck", "oob_checks", "nontemporal_store", "lane_accumulator_loops"]


class CPURenderer(Renderer):
  """Shared capabilities of the CPU renderers: no GPU dims, a thread index, threads from CPU_THREADS (else the machine
  model's cores, `tiny_codegen.machine`)."""
  device = "CPU"
  has_local = False
  has_shared = False
  has_threads = True
  supports_float4 = False
  global_max = None
  local_max = None
  thread_min_work = 1 << 18
  """Cost (`lower.dims.kernel_cost`: global bytes loaded/stored + ALU lane ops) below which a kernel runs on one
  thread. Sized for the native replay (`CPUGraph`), where a split kernel's shares go to helpers that spin on the
  pool's dispatch block: what a split costs there is the handoff, h ~ 2 cache-line transfers between cores (the
  helper sees the published launch, the launcher sees the last share finish: 0.11-0.13 µs measured on znver4, of the
  order of any x86 or Arm server core's cross-core line transfer), plus a few ns per share claimed. A kernel of t
  on one thread takes ~t/2 + h on two, so a split pays from t ~ 2h; the threshold keeps each share at least ~16
  handoffs (t >= 32h ~ 4 µs: below 4% overhead where the helper joins, and nothing lost where it doesn't, since the
  launching thread then claims every share itself); on more cores `lower.dims` gives no share less than half of it.
  At the 50-90 units/ns one thread does from cache (see
  `kernel_cost`): ~2^18 units. The Python launch path, where the handoff costs ~10 µs, runs shares of kernels below
  its own minimum inline (tiny-runtime-cpu `CPUProgram.python_min_work`, given `ProgramSpec.cost`)."""
  balance_min_work = 32 << 20
  shares_per_thread = 4
  """A kernel whose cost is at least `balance_min_work` (units of `thread_min_work`; ~0.5 ms and more on one thread)
  launches `shares_per_thread` shares per thread, which the pool's threads claim as they come free (see
  `lower.dims`), instead of one fixed share each. Measured on this project's 2-core VM, where one vCPU often runs a
  kernel's share 1.3-1.7x slower than the other for tens of ms: a training step's conv kernels alternating 2 and 8
  shares in one process, 8 shares' median 4-10% lower (the minimum the same); the convnet step's mean 97 -> 94 ms.
  An extra share costs a few µs (a claim and a ctypes call), under 1% of such a kernel."""
  decompose_ops: tuple[Ops, ...] = ()  # EXP2/LOG2/SIN listed here use tiny's polynomials instead of libm
  transcendental_via_f64: bool | tuple[Ops, ...] = True
  """Which of `decompose_ops` evaluate float32 through float64 and round once (True: all; a tuple: those)."""
  fused_mulacc = False
  """Whether the renderer renders a MULACC with arg "fma" as one fused multiply-add (one rounding); the
  decompositions of `decompose_ops` evaluate their polynomials with those where it does."""
  nontemporal_min_bytes = 16 << 20
  """Stores into an output buffer at least this big are streamed (non-temporal: they skip the cache and the read for
  ownership of each line, a third of an elementwise kernel's memory traffic) where the renderer can: a whole aligned
  cache line at once (see `nontemporal_store`). Smaller outputs stay cached for the kernel that reads them next.
  Set per machine in `__init__` (`streaming_min_bytes`); this class value is what the stated default machine gets.
  Measured on a 2-core znver4 (L3 32 MB): a+b over 4M floats (16 MB out) 2.2 -> 1.4 ms, 16M 8.9 -> 3.5 ms (a C
  microbenchmark into prefaulted buffers, 2 threads); at 1M (4 MB, all three arrays in L3) no gain."""
  cache_line = 64  # bytes: a non-temporal store must fill whole lines, else the write-combining buffer flushes partial

  def __init__(self, arch: str = ""):
    super().__init__(arch)
    # the cores this process may run on (the machine model's, as the CPU runtime's pool counts them), not every CPU
    # of the host: in a container pinned to 2 of 64 CPUs, 64 shares ran on 2 cores
    m = host_machine()
    self.threads: int = int(CPU_THREADS.value) or m.cores
    self.nontemporal_min_bytes = streaming_min_bytes(m)
    self.cache_line = m.line


def streaming_min_bytes(m: Machine) -> int:
  """The output size from which stores stream past the cache (`CPURenderer.nontemporal_min_bytes`): half the L3 this
  process's cores reach (their shares, `Machine.l3_per_core`, at most the whole L3; the L2s without an L3). Such an
  output, with the inputs it was computed from (an elementwise kernel's are as big), doesn't stay cached for the
  next kernel anyway, so writing it through the cache only adds the reads for ownership. The 2-core znver4 VM (32 MB
  L3 listed as shared by its 2 vCPUs, 8 MB a core): 8 MB, between the measured no-gain at 4 MB and the gain at 16."""
  reach = min(m.l3, m.l3_per_core * m.cores) if m.l3 else m.l2 * m.cores
  return max(m.line, reach // 2)


def nontemporal_store(renderer: Renderer, st: UOp) -> bool:
  """Whether STORE `st` streams past the cache (see `CPURenderer.nontemporal_min_bytes`): an ungated store of one
  whole cache line (a vector of `cache_line` bytes) into a PARAM of at least `nontemporal_min_bytes`. The renderer
  still checks the address's alignment at run time (a view can start anywhere) and stores normally when unaligned."""
  idx, val = st.src[0], st.src[1]
  if idx.op is not Ops.INDEX or len(idx.src) > 2 or (buf := idx.src[0]).op is not Ops.PARAM: return False
  line, least = getattr(renderer, "cache_line", 0), getattr(renderer, "nontemporal_min_bytes", 0)
  if not line or not least or val.dtype.count < 2 or val.dtype.itemsize != line: return False
  size = getattr(buf.dtype, "size", -1)
  return size > 0 and size * buf.dtype.base.itemsize >= least


class OOBCheck(NamedTuple):
  """What a CHECK_OOB kernel tests before one memory access (an INDEX used by LOADs and/or STOREs): the access of
  `width` elements at the index lies in [0, size) of the buffer; else the kernel records (kind, slot, index, size)
  in its global `<kernel name>_oob` (four int64s: kind 1 a read, 2 a write; slot the PARAM slot, -1 a register
  array) and skips the access (a read gives 0). The CPU runtime raises after the launch when kind is not 0."""
  width: int
  kind: int
  slot: int
  size: int


def oob_checks(uops: list[UOp]) -> dict[UOp, OOBCheck]:
  """The bounds checks of a kernel's memory accesses (see `OOBCheck`): every INDEX into a PARAM or DEFINE_REG of known
  size that a LOAD or STORE goes through."""
  out: dict[UOp, OOBCheck] = {}
  for u in uops:
    if u.op not in (Ops.LOAD, Ops.STORE) or (idx := u.src[0]).op is not Ops.INDEX: continue
    buf, dt = idx.src[0], (u.dtype if u.op is Ops.LOAD else u.src[1].dtype)
    if buf.op not in (Ops.PARAM, Ops.DEFINE_REG) or (size := getattr(buf.dtype, "size", -1)) <= 0: continue
    prev = out.get(idx)
    kind = 2 if u.op is Ops.STORE or (prev is not None and prev.kind == 2) else 1
    width = max(1, dt.count // buf.dtype.base.count)  # elements of the buffer's type (a register may hold vectors)
    out[idx] = OOBCheck(max(width, prev.width if prev else 1), kind, buf.arg if buf.op is Ops.PARAM else -1, size)
  return out


def count_uses(uops: list[UOp], twice: Callable[[UOp], bool]) -> dict[UOp, int]:
  """How often each value is used in code (GROUP/END/SINK and the ordering-only sources of LOAD/STORE don't count);
  a user for which `twice(user)` holds counts double (it spells an operand twice, so it needs a variable)."""
  uses: dict[UOp, int] = {}
  for u in uops:
    if u.op in (Ops.GROUP, Ops.END, Ops.SINK): continue
    for x in (u.src[:1] if u.op is Ops.LOAD else u.src[:2] if u.op is Ops.STORE else u.src):
      uses[x] = uses.get(x, 0) + (2 if twice(u) else 1)
  return uses


def lane_accumulator_loops(uops: list[UOp]) -> set[UOp]:
  """The REDUCE loops whose body updates two or more scalar register accumulators: the lanes of a reduce the optimizer
  unrolled (the expander gives each lane its own accumulator; `opt/heuristic.py`), which the SLP vectorizer packs
  into one vector of contiguous loads. A CPU renderer keeps LLVM's loop vectorizer off these loops: it would
  vectorize one across its iterations instead, for any reduction it may reorder (integer sums, min/max: not a float
  sum), and load each lane's elements with a strided gather. A row max of a 4096² float32 matrix ran 11.3 ms that
  way instead of 2.1, a row argmax 23.7 ms instead of 4.5, an int32 row sum 11.0 ms instead of 1.8."""
  out: set[UOp] = set()
  slots: dict[UOp, set[tuple[UOp, UOp]]] = {}
  inner: list[UOp] = []  # the open loops, innermost last
  for u in uops:
    if u.op is Ops.RANGE:
      inner.append(u)
      slots[u] = set()
    elif u.op is Ops.END and u.src and u.src[-1] in slots:
      r = u.src[-1]
      if isinstance(r.arg, tuple) and r.arg[1] is AxisType.REDUCE and len(slots[r]) >= 2: out.add(r)
      if r in inner: inner.remove(r)
    elif u.op is Ops.STORE and inner and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_REG \
        and u.src[1].dtype.count == 1:
      slots[inner[-1]].add((u.src[0].src[0], u.src[0].src[1]))
  return out


def kernel_params(uops: list[UOp]) -> tuple[list[UOp], list[UOp]]:
  """The kernel's buffer PARAMs (by slot) and DEFINE_VARs (by name): its argument order before `core_id`."""
  params = sorted({u: None for u in uops if u.op is Ops.PARAM}, key=lambda u: u.arg)
  dvars = sorted({u: None for u in uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
  return params, dvars


class RenderError(RuntimeError):
  """A renderer met linear UOps it can't spell: a bug in lowering or in the renderer, never in the user's program."""


def _describe(u: UOp) -> str:
  return f"{u.op.name} {u.dtype} arg={u.arg!r} ({len(u.src)} sources: {', '.join(x.op.name for x in u.src)})"


class ValueNames(dict[UOp, Any]):
  """A renderer's map from a UOp to its rendered value (an expression, register names): reading a UOp that has none
  yet raises `RenderError` naming it, instead of a bare KeyError (or an empty string)."""

  def __missing__(self, u: UOp) -> Any:
    raise RenderError(f"{_describe(u)} is used before it has a value: it must be rendered before its users "
                      "(lowering or renderer bug)")


class SourceExprs(Sequence[str]):
  """The expressions of `u`'s sources in `r`, looked up when one is read: a source with no expression (not rendered
  yet, or an op that has none) or an empty one raises `RenderError` naming both UOps. It never reads as "", so a
  renderer can't print `Ridx1 < ;`. Sources a renderer doesn't read (ordering-only ones) are never looked up."""

  def __init__(self, r: dict[UOp, str], u: UOp) -> None: self.r, self.u = r, u

  def __len__(self) -> int: return len(self.u.src)

  @overload
  def __getitem__(self, i: int) -> str: ...
  @overload
  def __getitem__(self, i: slice) -> list[str]: ...
  def __getitem__(self, i: int | slice) -> str | list[str]:
    if isinstance(i, slice): return [self[j] for j in range(*i.indices(len(self)))]
    x = self.u.src[i]
    if not (e := self.r.get(x)):
      raise RenderError(f"source {i} of {_describe(self.u)} has {'an empty' if x in self.r else 'no'} expression: "
                        f"{_describe(x)}; it must be rendered before its users (lowering or renderer bug)")
    return e

  def __iter__(self) -> Iterator[str]: return (self[i] for i in range(len(self)))


class CWriter:
  """What a C-like renderer (C, OpenCL C) keeps while it walks linear UOps: each value's expression or variable
  (`r`), the gates of INDEXes, the body lines at their indentation, fresh names; and the ops every C dialect spells
  the same (`common`). A dialect renders the rest (types, constants, memory, ALU tables) itself."""

  def __init__(self, render_dtype: Callable[[DType], str] | None = None) -> None:
    self.render_dtype = render_dtype  # the dialect's type names (a loop counter is int, or its int64 type)
    self.r: dict[UOp, str] = ValueNames()
    self.gates: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.depth = 1
    self._counters: dict[str, int] = {}
    self.no_loop_vectorize: set[UOp] = set()  # loops opened under clang's pragma to leave them to the SLP vectorizer

  def fresh(self, prefix: str) -> str:
    n = self._counters.get(prefix, 0)
    self._counters[prefix] = n + 1
    return f"{prefix}{n}"

  def emit(self, line: str) -> None: self.lines.append("  " * self.depth + line)

  def assign(self, u: UOp, expr: str, ctype: str, prefix: str, inline: bool = False) -> None:
    """`u` is `expr`: written where it is used when `inline`, else a fresh variable `prefix<n>` of type `ctype`."""
    if not expr: raise RenderError(f"empty expression for {_describe(u)}")
    if inline: self.r[u] = expr
    else:
      self.r[u] = self.fresh(prefix)
      self.emit(f"{ctype} {self.r[u]} = {expr};")

  def common(self, u: UOp, s: Sequence[str]) -> bool:
    """Render `u` (source expressions `s`) if it is a buffer/variable name, a loop or IF, a pointer INDEX, or an op
    with no code; False for anything else."""
    op = u.op
    if op is Ops.PARAM: self.r[u] = f"data{u.arg}"
    elif op is Ops.DEFINE_VAR: self.r[u] = var_ident(u.arg[0])
    elif op is Ops.RANGE:
      self.r[u] = f"{AXIS_LETTER.get(u.arg[1], 'r')}idx{u.arg[0]}" if isinstance(u.arg, tuple) else f"ridx{u.arg}"
      ctype = "int" if u.dtype == dtypes.int32 or self.render_dtype is None else self.render_dtype(u.dtype)
      if u in self.no_loop_vectorize: self.emit("#pragma clang loop vectorize(disable)")  # lane_accumulator_loops
      self.emit(f"for ({ctype} {self.r[u]} = 0; {self.r[u]} < {s[0]}; {self.r[u]}++) {{")
      self.depth += 1
    elif op is Ops.IF:
      self.emit(f"if ({s[0]}) {{")
      self.depth += 1
    elif op in (Ops.END, Ops.ENDIF):
      self.depth -= 1
      self.emit("}")
    elif op is Ops.INDEX:
      self.r[u] = f"({s[0]}+{s[1]})"
      if len(u.src) > 2: self.gates[u] = s[2]
    elif op is Ops.AFTER: self.r[u] = s[0]
    elif op not in (Ops.GROUP, Ops.SINK, Ops.NOOP): return False
    return True

  def store(self, idx: UOp, st: str) -> None:
    """A store statement `st` through INDEX `idx`, skipped where its gate is false."""
    self.emit(f"if ({self.gates[idx]}) {st}" if idx in self.gates else st)


def var_ident(name: str) -> str:
  """The identifier a Variable named `name` gets in rendered source (C, OpenCL, PTX, LLVM IR).

  A Variable's name is any string (ONNX names an unknown dim `"x.0"`, a `dim_param` may be `"batch size"`), but kernel
  source needs an identifier. A plain identifier (`[A-Za-z_][A-Za-z0-9_]*`) is kept; any other name becomes `esc_`
  followed by its ASCII letters and digits, every other character as `_<hex code point>_`: `"x.0"` -> `esc_x_2e_0`.
  The map is one-to-one (plain names never start with `esc_`; those that do are escaped too), so two Variables never
  share an identifier. Arguments are passed by position (`kernel_params`), so the runtime never needs the name back.

  >>> var_ident("start_pos"), var_ident("x.0")
  ('start_pos', 'esc_x_2e_0')
  """
  if _PLAIN_IDENT.fullmatch(name) and not name.startswith("esc_"): return name
  return "esc_" + "".join(c if c.isascii() and c.isalnum() else f"_{ord(c):x}_" for c in name)


_PLAIN_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def var_args(dvars: list[UOp], ctype: str) -> list[str]:
  """One `<ctype> name` argument per distinct DEFINE_VAR name, in order (names as `var_ident` spells them)."""
  return [f"{ctype} {var_ident(n)}" for n in dict.fromkeys(v.arg[0] for v in dvars)]
