"""`to_program` / `get_program`: a kernel AST to a rendered, compiled program (docs/PIPELINE.md §4)."""
from __future__ import annotations

import functools
import re
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiny_uop.device import ProgramSpec, Renderer
from tiny_uop.helpers import BEAM, CHECK_OOB, DEBUG, IMAGE, NOOPT, USE_TC, ContextVar
from tiny_uop.trace import traced
from tiny_uop.uop import KernelInfo, Ops, UOp

from tiny_codegen.lower import lower
from tiny_codegen.renderer import kernel_params

if TYPE_CHECKING:
  from tiny_codegen.opt.kernel import Opt
  from tiny_codegen.renderer.llvmir import LLVMRenderer

__all__ = ["ProgramInfo", "to_program", "get_program", "spec_from_program", "kernel_name", "CODEGEN_FLAGS",
           "codegen_flags"]

CODEGEN_FLAGS: tuple[ContextVar, ...] = (NOOPT, BEAM, CHECK_OOB, USE_TC, IMAGE)
"""The flags whose values change what a kernel AST compiles to (opts, bounds checks, tensor cores, images): part of
the key of every cache of compiled programs (`to_program`'s, a runtime's): a `Context` that sets one compiles anew."""


def codegen_flags() -> tuple:
  """The values of `CODEGEN_FLAGS` now (a cache key part).

  >>> from tiny_uop.helpers import Context
  >>> with Context(NOOPT=1): codegen_flags()[0]
  1
  """
  return tuple([f.value for f in CODEGEN_FLAGS])


@dataclass(frozen=True)
class ProgramInfo:
  """The arg of a PROGRAM UOp: what a runtime needs beyond the binary."""
  name: str
  global_size: tuple[int, ...] = (1, 1, 1)
  local_size: tuple[int, ...] | None = None
  vars: tuple[UOp, ...] = ()
  globals: tuple[int, ...] = ()
  outs: tuple[int, ...] = ()
  ins: tuple[int, ...] = ()
  cost: int = 0  # a split CPU kernel's `lower.dims.kernel_cost`, for the runtime's launch path (0: unknown)


# base name -> (kernel AST -> its name, how many names that base has handed out): weak on the ASTs, so a kernel
# nothing refers to any more leaves the table (a counter, never reused, keeps later names unique)
_names: dict[str, tuple[weakref.WeakKeyDictionary[UOp, str], list[int]]] = {}
_names_lock = threading.Lock()


def kernel_name(ast: UOp) -> str:
  """A readable name from the kernel's loops: `E_32_4` (elementwise) or `r_16_8` (with a reduce), made unique
  with a counter suffix when different kernels would share it. A KernelInfo name other than "kernel" is kept."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  if info.name != "kernel":
    base = re.sub(r"[^A-Za-z0-9_]", "_", info.name)
    if not base or base[0].isdigit(): base = f"k_{base}"  # a C/LLVM identifier can't start with a digit
  else:
    rngs = sorted({u: None for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    red = any(u.op is Ops.REDUCE for u in ast.toposort())
    dims = [str(r.src[0].arg) if r.src[0].op is Ops.CONST else
            (r.src[0].arg[0] if r.src[0].op is Ops.DEFINE_VAR else "n") for r in rngs]
    base = ("r" if red else "E") + ("_" + "_".join(dims) if dims else "")
  with _names_lock:
    seen, count = _names.setdefault(base, (weakref.WeakKeyDictionary(), [0]))
    if (name := seen.get(ast)) is None:
      name = seen[ast] = base if count[0] == 0 else f"{base}n{count[0]}"
      count[0] += 1
    return name


def _outs_ins(uops: list[UOp]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  outs: list[int] = []
  ins: list[int] = []
  for u in uops:
    if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op is not Ops.INDEX: continue
    buf = u.src[0].src[0]
    if buf.op is not Ops.PARAM: continue
    (outs if u.op is Ops.STORE else ins).append(buf.arg)
  return tuple(sorted(set(outs))), tuple(sorted(set(ins)))


@traced("kernel")  # VIZ: a kernel's pipeline, its rewrites and final source (one check when nothing records)
def to_program(ast: UOp, renderer: Renderer) -> UOp:
  """Lower, render and compile kernel `ast` for `renderer`: PROGRAM(src=(SINK, DEVICE, LINEAR, SOURCE, BINARY)) with a
  `ProgramInfo` arg. SINK is the kernel AST given; LINEAR holds the linear UOps; BINARY the compiled bytes."""
  return _to_program(ast, renderer, _renderer_key(renderer))


def _renderer_key(r: Renderer) -> tuple:
  """What makes the same AST compile differently on the same renderer object (its settings, optimizer flags)."""
  return (type(r), r.arch, getattr(r, "threads", None), getattr(r, "thread_min_work", None),
          getattr(r, "balance_min_work", None), getattr(r, "shares_per_thread", None), codegen_flags(),
          tuple(getattr(r, "decompose_ops", ())), getattr(r, "transcendental_via_f64", None))


@functools.lru_cache(maxsize=4096)
def _to_program(ast: UOp, renderer: Renderer, key: tuple) -> UOp:
  name = kernel_name(ast)
  info_arg = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  named = ast.replace(arg=KernelInfo(name, info_arg.opts_to_apply, info_arg.applied_opts, info_arg.dont_use_locals))
  if (amx := _amx_program(named, name, renderer)) is not None: return amx
  if (vnni := _vnni_program(named, name, renderer)) is not None: return vnni
  if (mv := _f32_matvec_program(named, name, renderer)) is not None: return mv
  low = lower(named, renderer, True, _beam)  # optimize, with BEAM's search
  src = renderer.render(low.uops)
  if DEBUG >= 4: print(f"*** source of {name} ({type(renderer).__name__}):\n{src}")  # once: this is cached
  lib = renderer.compiler.compile_cached(src)
  params, dvars = kernel_params(low.uops)
  vars_by_name: dict[str, UOp] = {}
  for v in dvars: vars_by_name.setdefault(v.arg[0], v)
  outs, ins = _outs_ins(low.uops)
  info = ProgramInfo(name, tuple(low.dims.global_size), low.dims.local_size, tuple(vars_by_name.values()),
                     tuple(p.arg for p in params), outs, ins, low.dims.cost)
  return UOp(Ops.PROGRAM, src=(ast, UOp(Ops.DEVICE, arg=renderer.device), UOp(Ops.LINEAR, src=tuple(low.uops)),
                               UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)


def _amx_program(ast: UOp, name: str, renderer: Renderer) -> UOp | None:
  """The PROGRAM of `tiny_codegen.x86_amx`'s tile kernel for a kernel AST `x86_amx.match_matmul` recognises (what
  `Tensor.dot` builds for a bfloat16 matmul) or one registered over a B in its panels (`x86_amx.register_packed_b`),
  on the LLVM CPU renderer where `request_tile_state()` holds and
  CHECK_OOB is off (the tile kernel has no bounds checks); None otherwise (lowered as usual). Threads: the renderer's,
  over 32-row blocks, then column blocks (`x86_amx.split_threads`: a 32-row chunk's one row block), fewer where
  neither splits evenly; the K block from the machine model's L1d (`x86_amx.k_block`)."""
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  if not isinstance(renderer, LLVMRenderer) or CHECK_OOB.value: return None
  from tiny_codegen import x86_amx
  b_packed = False
  if (mnk := x86_amx.match_matmul_layout(ast)) is None and (reg := x86_amx.registered_packed_b(ast)) is not None:
    mnk, b_packed = (*reg, False, reg[2]), True  # B already in the kernel's panels (`x86_amx.pack_b`)
  if mnk is None or not x86_amx.request_tile_state(): return _avx512_bf16_program(ast, name, renderer)
  m, n, k, out_bf16, lda = mnk
  threads, col_threads = x86_amx.split_threads(m, n, max(1, int(getattr(renderer, "threads", 1))))
  from tiny_codegen.machine import machine_of
  kb = x86_amx.k_block(k, machine_of(renderer).l1d)  # the K block from this machine's L1d
  src = x86_amx.amx_bf16_matmul_ir(m, n, k, threads, name=name, out_bf16=out_bf16, kb=kb, lda=lda,
                                   col_threads=col_threads, b_packed=b_packed)
  if DEBUG >= 4: print(f"*** source of {name} (x86_amx tile kernel):\n{src}")
  lib = renderer.compiler.compile_cached(src)
  info = ProgramInfo(name, (threads, 1, 1), None, (), (0, 1, 2), (0,), (1, 2))
  return UOp(Ops.PROGRAM, src=(ast, UOp(Ops.DEVICE, arg=renderer.device), UOp(Ops.LINEAR, src=()),
                               UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)


def _avx512_bf16_program(ast: UOp, name: str, renderer: LLVMRenderer) -> UOp | None:
  """The PROGRAM of `tiny_codegen.x86_bf16`'s `vdpbf16ps` kernel for a kernel AST `x86_amx.match_matmul_layout`
  recognises at any size, where the AMX tile kernel doesn't take it (`_amx_program`), on a machine whose model lists
  AVX512-BF16 and whose probe ran it and whose stack holds its strip (`x86_bf16.for_renderer`); None
  otherwise (lowered as usual). Register block from the machine model (`x86_bf16.register_block`); threads: the
  renderer's, over column strips, then rows (`x86_bf16.split_threads`)."""
  from tiny_codegen import x86_amx, x86_bf16
  if (got := x86_amx.match_matmul_layout(ast, any_size=True)) is None: return None
  m, n, k, out_bf16, lda = got
  if (blk := x86_bf16.for_renderer(renderer, m, n, k)) is None: return None
  threads = max(1, int(getattr(renderer, "threads", 1)))
  src = x86_bf16.avx512_bf16_matmul_ir(m, n, k, threads, name=name, out_bf16=out_bf16, lda=lda, mr=blk[0], nv=blk[1])
  if DEBUG >= 4: print(f"*** source of {name} (x86_bf16 vdpbf16ps kernel):\n{src}")
  lib = renderer.compiler.compile_cached(src)
  info = ProgramInfo(name, (threads, 1, 1), None, (), (0, 1, 2), (0,), (1, 2))
  return UOp(Ops.PROGRAM, src=(ast, UOp(Ops.DEVICE, arg=renderer.device), UOp(Ops.LINEAR, src=()),
                               UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)


def _vnni_program(ast: UOp, name: str, renderer: Renderer) -> UOp | None:
  """The PROGRAM of `tiny_codegen.x86_vnni`'s Q8_0 matvec kernel for a kernel AST `x86_vnni.match_q8_0_matvec`
  recognises (what `tiny_tensor.llm.quants.q8_0_matvec` builds), or of its Q4_K kernel for one registered there
  (`x86_vnni.register_kernel`), on the LLVM CPU renderer of a machine with VNNI
  (`x86_vnni.vnni_form` of its `Machine.isa`) and CHECK_OOB off; None otherwise (lowered as usual: the same sums in
  plain int32 math). Threads: the renderer's, fewer where the rows don't split evenly."""
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  if not isinstance(renderer, LLVMRenderer) or CHECK_OOB.value: return None
  from tiny_codegen import x86_vnni
  from tiny_codegen.machine import machine_of
  order: tuple[str, ...] = ()
  if (shape := x86_vnni.match_q8_0_matvec(ast)) is not None: kind, (o, nb) = "q8_0", shape
  elif (reg := x86_vnni.registered_kernel(ast)) is not None: kind, o, nb, order = reg
  else: return None
  if (form := x86_vnni.vnni_form(machine_of(renderer).isa)) is None: return None  # after the match: it may probe
  threads = max(1, int(getattr(renderer, "threads", 1)))
  while threads > 1 and o % threads: threads -= 1
  if kind == "q8_0": src = x86_vnni.q8_0_matvec_ir(o, nb, threads, name=name, form=form)
  else: src = x86_vnni.q4_k_matvec_ir(o, nb, threads, name=name, form=form, order=order)
  if DEBUG >= 4: print(f"*** source of {name} (x86_vnni {kind} matvec):\n{src}")
  lib = renderer.compiler.compile_cached(src)
  out = order.index("out") if order else 0
  info = ProgramInfo(name, (threads, 1, 1), None, (), (0, 1, 2, 3), (out,), tuple(i for i in range(4) if i != out))
  return UOp(Ops.PROGRAM, src=(ast, UOp(Ops.DEVICE, arg=renderer.device), UOp(Ops.LINEAR, src=()),
                               UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)


def _f32_matvec_program(ast: UOp, name: str, renderer: Renderer) -> UOp | None:
  """The PROGRAM of `tiny_codegen.matvec_ir`'s prefetching float32 matvec for a kernel AST registered there
  (`matvec_ir.register_kernel`: `tiny_tensor.llm`'s one-row projections), on the LLVM CPU renderer with CHECK_OOB
  off; None otherwise (lowered as usual). Vector lanes, accumulators and the prefetch distance from the machine model
  (`machine_of(renderer)`, the renderer's vector registers); threads: the renderer's, fewer where the rows don't
  split evenly."""
  from tiny_codegen import matvec_ir
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  if not isinstance(renderer, LLVMRenderer) or CHECK_OOB.value: return None
  if (reg := matvec_ir.registered_kernel(ast)) is None: return None
  from tiny_codegen.machine import FMA_LATENCY, machine_of
  o, k, order = reg
  m, (regs, vbytes) = machine_of(renderer), renderer.vector_registers
  lanes = vbytes // 4
  if not regs or not matvec_ir.fits(o, k, lanes): return None
  threads = max(1, int(getattr(renderer, "threads", 1)))
  while threads > 1 and o % threads: threads -= 1
  rows = matvec_ir.group_rows(o // threads)
  unroll = matvec_ir.accumulators(FMA_LATENCY, regs, rows)  # one FMA unit's chains (`accumulators` says why)
  ahead = matvec_ir.prefetch_ahead(m.l1d, m.l1d_ways, m.line, unroll * vbytes)
  src = matvec_ir.f32_matvec_ir(o, k, threads, name=name, lanes=lanes, unroll=unroll, ahead=ahead, line=m.line,
                                order=order)
  if DEBUG >= 4: print(f"*** source of {name} (matvec_ir f32 matvec):\n{src}")
  lib = renderer.compiler.compile_cached(src)
  out = order.index("out")
  info = ProgramInfo(name, (threads, 1, 1), None, (), (0, 1, 2), (out,), tuple(i for i in range(3) if i != out))
  return UOp(Ops.PROGRAM, src=(ast, UOp(Ops.DEVICE, arg=renderer.device), UOp(Ops.LINEAR, src=()),
                               UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)


def spec_from_program(prg: UOp) -> ProgramSpec:
  """The `ProgramSpec` a runtime launches, from a PROGRAM UOp."""
  if prg.op is not Ops.PROGRAM or not isinstance(prg.arg, ProgramInfo):
    raise ValueError(f"spec_from_program needs a PROGRAM made by to_program, got {prg.op}")
  info: ProgramInfo = prg.arg
  _, dev, linear, source, binary = prg.src
  return ProgramSpec(info.name, source.arg, dev.arg, binary.arg, info.global_size, info.local_size, list(info.vars),
                     list(info.globals), list(info.outs), list(info.ins), None, list(linear.src), info.cost)


def _beam(ast: UOp, renderer: Renderer, amt: int) -> tuple[Opt, ...]:
  """BEAM's search (`optimize_kernel` calls it when `BEAM>=1`), timing candidates compiled by `get_program`."""
  from tiny_codegen.opt.search import beam_search  # lazy: BEAM is rare and opens a device
  return beam_search(ast, renderer, amt, compile=get_program)


def get_program(ast: UOp, renderer: Renderer) -> ProgramSpec:
  """Lower, render and compile kernel `ast` for `renderer`, as the `ProgramSpec` a runtime launches."""
  return spec_from_program(to_program(ast, renderer))

