"""BEAM search: time candidate opt sequences on the device and keep the fastest (`BEAM=n`).

1. Seeds: the unoptimized kernel and the hand-coded heuristics' opts (`hand_coded_optimizations`), so the search
   starts where the heuristics end and can only replace them with something it measured faster.
2. Rounds: every kernel of the beam (the `n` fastest so far) grows by one opt of `ACTIONS`; the candidates are
   compiled and timed (each the least of several runs: `_Timer`; once, if over `CUTOFF` times the best); the `n`
   fastest form the next beam, until a round finds nothing faster than the best so far.
3. Final: the few fastest candidates and the heuristics' are timed again, in turns (so that a burst of load on a
   shared machine hits all of them alike); a candidate replaces the heuristics only if it is faster by `MARGIN`.

The winner is cached on disk under `cache_key`: the kernel's exact structure (its name aside), the renderer (class,
arch, its settings: class defaults and instance values, such as the CPU thread count), the device it is timed on
(`timing_device`: DEV's entry for the renderer's device, with its interface: `MOCK+AMD`'s emulator is not an AMD
GPU), the compiler's identity (target
triple, CPU and features, flags), the CPU renderer's machine model (`tiny_codegen.machine`: caches, vector registers,
cores), the beam width, the action set and the search's version. The device is opened
through the plugin registry (codegen never imports a runtime).

The search is given the compiler it times candidates with (`compile`: `tiny_codegen.get_program`, which passes it):
the compiler runs the lowering pipeline, whose optimizer hook calls this search, so importing it here would close
an import circle (issue #33).
"""
from __future__ import annotations

import hashlib
import math
import pickle
import time
from typing import Any, Callable

from tiny_uop.device import Buffer, ProgramSpec, Renderer, diskcache_get, diskcache_put
from tiny_uop.dtype import PtrDType
from tiny_uop.helpers import DEBUG, IGNORE_BEAM_CACHE
from tiny_uop.uop import KernelInfo, Ops, UOp, structure_key

from tiny_codegen.opt.heuristic import hand_coded_optimizations
from tiny_codegen.opt.kernel import Kernel, KernelOptError, Opt, OptOps

ACTIONS: list[Opt] = [
  *[Opt(OptOps.UPCAST, axis, amt) for amt in (0, 2, 3, 4, 5, 7, 8, 16) for axis in range(6)],
  *[Opt(OptOps.UNROLL, axis, amt) for amt in (0, 4, 7, 8, 16) for axis in range(4)],
  *[Opt(OptOps.LOCAL, axis, amt) for amt in (2, 3, 4, 8, 13, 16, 29, 32) for axis in range(6)],
  *[Opt(OptOps.GROUPTOP, axis, amt) for amt in (13, 16, 28, 29, 32, 49, 64, 256) for axis in range(3)],
  *[Opt(OptOps.GROUP, axis, amt) for amt in (0, 4, 8, 16) for axis in range(3)],
  *[Opt(OptOps.PADTO, axis, 32) for axis in range(6)],
  # the CPU heuristics' row tiles (`_tile_rows`, sized from the machine's L3 share): BEAM searches their size too
  *[Opt(OptOps.TILE, axis, amt) for amt in (8, 16, 32, 64, 128) for axis in range(2)],
  Opt(OptOps.NOLOCALS),
]
SEARCH_VERSION = 5  # part of the cache key: bump when the way a winner is chosen changes (3: the CPU heuristics
                    # seed widened matmul blocks, so an older winner may be slower than the seed; 4: they seed TILE;
                    # 5: they seed TILE on AVX-512 too)
MARGIN = 0.03       # a candidate replaces the heuristics' opts only when at least 3% faster in the final timing
FINALISTS = 3       # candidates (besides the heuristics') timed again at the end
MIN_RUNS, MAX_RUNS, RUN_BUDGET = 3, 20, 0.05  # runs per timing: at least 3, more while under 50 ms in all
CUTOFF = 2.0  # a candidate whose run takes over twice the best time so far is timed once (a naive 1024^2 matmul's
              # first round of candidates took ~3 minutes at 3 runs each)


Compile = Callable[[UOp, Renderer], ProgramSpec]
"""Lower, render and compile a kernel AST for a renderer (`tiny_codegen.get_program`)."""


class _Timer:
  """Compiles (with `compile`) and times opt sequences of one kernel on fresh buffers of its own (allocated once per
  search)."""

  def __init__(self, ast: UOp, renderer: Renderer, compile: Compile):
    from tiny_uop.plugins import Device
    device = timing_device(renderer)
    self.ast, self.renderer, self.dev = as_optimized(ast), renderer, Device[device]
    self.info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    self.bufs = _buffers_for(ast, device)
    self.programs: dict[tuple[Opt, ...], Any] = {}
    self.compile = compile

  def fixed(self, opts: tuple[Opt, ...]) -> UOp:
    """The kernel with exactly `opts` to apply: compiling it applies them and starts no search."""
    return self.ast.replace(arg=KernelInfo(self.info.name, opts, (), self.info.dont_use_locals))

  def _program(self, opts: tuple[Opt, ...]) -> Any:
    if (p := self.programs.get(opts)) is None:
      spec = self.compile(self.fixed(opts), self.renderer)
      # its cost decides its launch as the engine's does (a cheap split kernel's shares inline on the CPU)
      prg = self.dev.get_program(spec.name, spec.lib, cost=spec.cost) if getattr(spec, "cost", 0) else \
        self.dev.get_program(spec.name, spec.lib)
      args = [self.bufs[s]._buf for s in spec.globals]
      vals = tuple(v.arg[1] for v in spec.vars)  # symbolic sizes are timed at their smallest value
      p = self.programs[opts] = (prg, args, vals, spec)
    return p

  def time(self, opts: tuple[Opt, ...], min_runs: int = MIN_RUNS, cutoff: float = math.inf) -> float:
    """Seconds of one launch of the kernel with `opts`: the least of `min_runs` runs or more (up to `MAX_RUNS` while
    the runs take less than `RUN_BUDGET` in all): the least is the run the fewest interruptions slowed. A run slower
    than `cutoff` ends the timing (a candidate that far behind is no contender: one run of it is enough)."""
    prg, args, vals, spec = self._program(opts)
    best, spent, runs = math.inf, 0.0, 0
    while runs < min_runs or (runs < MAX_RUNS and spent < RUN_BUDGET):
      st = time.perf_counter()
      t = prg(*args, global_size=spec.global_size, local_size=spec.local_size, vals=vals, wait=True)
      took = time.perf_counter() - st
      best, spent, runs = min(best, t if t is not None else took), spent + took, runs + 1
      if best > cutoff: break
    return best


def _buffers_for(ast: UOp, device: str) -> list[Buffer]:
  """A buffer per PARAM of `ast`, zeros written into each: a fresh host mapping that was never written reads as the
  kernel's one shared zero page, always in cache (a 16M-float a+b timed 2 ms instead of 6), and zeros are a safe
  index for a gather."""
  params = sorted({u: None for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda u: u.arg)
  out: list[Buffer] = []
  for p in params:
    assert isinstance(p.dtype, PtrDType)
    size = p.dtype.size if p.dtype.size > 0 else 1
    buf = Buffer(device, size, p.dtype.base).allocate()
    out.append(buf.copyin(memoryview(bytearray(buf.nbytes))))
  return out


def _renderer_text(renderer: Renderer) -> str | None:
  """Everything about the renderer that changes the code or its speed: class, arch, device and the interface it is
  timed through (`MOCK+AMD`'s emulator is not an AMD GPU), its instance settings (the CPU thread count, ...) and its
  compiler's identity (triple, CPU name and features, flags). None when the compiler has no identity (no disk cache:
  `CACHELEVEL=0` when it was made): then nothing is cached."""
  comp = getattr(renderer, "compiler", None)
  ident = getattr(comp, "cachekey", None)
  if comp is not None and ident is None: return None
  settings = sorted(_settings(renderer).items())
  # the CPU heuristics' seed follows the machine model (caches, TINY_MACHINE overrides): part of the key
  machine = getattr(renderer, "machine", None)
  return (f"{type(renderer).__module__}.{type(renderer).__qualname__}\0{renderer.arch}\0{timing_device(renderer)}\0"
          f"{settings!r}\0{type(comp).__qualname__}\0{ident}\0{machine!r}")


def _settings(renderer: Renderer) -> dict[str, object]:
  """The renderer's plain settings, class defaults (`thread_min_work`, `balance_min_work`, ...) overridden by the
  instance's: a default changed in a new release changes the key too. A value whose repr names an object's address
  (it differs from process to process) is left out."""
  out: dict[str, object] = {}
  for scope in (*(vars(c) for c in reversed(type(renderer).__mro__)), vars(renderer)):
    for k, v in scope.items():
      if k.startswith("_") or not isinstance(v, (bool, int, float, str, tuple)): continue
      if " at 0x" in repr(v): continue
      out[k] = v
  return out


def timing_device(renderer: Renderer) -> str:
  """The device the search times on: `DEV`'s entry for the renderer's device, with its interface (`MOCK+AMD`: the
  emulator, when DEV says so), else the renderer's device itself."""
  from tiny_uop.helpers import DEV
  from tiny_uop.target import Target
  for t in Target.parse_list(dev) if (dev := str(DEV.value or "").strip()) else ():
    if t.device == renderer.device: return t.names[0]
  return renderer.device


def cache_key(ast: UOp, renderer: Renderer, amt: int) -> str | None:
  """The disk-cache key of a search (see the module docstring); None: not cacheable. `structure_key` hashes every
  node (a printed AST is cut in the middle for big graphs, so two kernels could share a key); the kernel's name is
  left out (the same kernel under another name is the same search), whether it may use locals is not."""
  ren = _renderer_text(renderer)
  if ren is None: return None
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  anon = ast.replace(arg=KernelInfo("kernel", info.opts_to_apply, info.applied_opts, info.dont_use_locals))
  text = f"beam{SEARCH_VERSION}\0{amt}\0{ACTIONS!r}\0{MARGIN}\0{ren}\0{structure_key(anon)}"
  return hashlib.sha256(text.encode()).hexdigest()


_cache_key = cache_key  # the name tests and older callers use


def as_optimized(ast: UOp) -> UOp:
  """`ast` as lowering hands it to the optimizer (one-hot gathers folded, nested reduce ranges merged): opts name axes
  of that AST, so the heuristics' seed, the candidates and their compiled programs must all start from it. (A 16M
  `sum()`'s second kernel has 2 reduce ranges, merged into one: opts chosen on the schedule's AST didn't apply.)
  Both passes leave an AST they already ran on unchanged (`lower.pre_optimize`, the one `lower` runs)."""
  from tiny_codegen.lower import pre_optimize
  return pre_optimize(ast)


def heuristic_opts(ast: UOp, renderer: Renderer) -> tuple[Opt, ...]:
  """The opts the hand-coded heuristics choose for `ast` (the search's seed), on the AST the optimizer sees."""
  return tuple(hand_coded_optimizations(Kernel(as_optimized(ast), renderer)).applied_opts)


def _kernel_for(ast: UOp, renderer: Renderer, opts: tuple[Opt, ...]) -> Kernel:
  k = Kernel(ast, renderer)
  for o in opts: k.apply_opt(o)
  return k


Timed = list[tuple[tuple[Opt, ...], float]]


def beam_candidates(ast: UOp, renderer: Renderer, amt: int, timer: _Timer | None = None, *,
                    compile: Compile) -> tuple[Timed, tuple[Opt, ...]]:
  """(every opt sequence the search timed, in the order it timed them -- the seeds first: the unoptimized kernel, then
  the heuristics' -- each with its seconds; the chosen one), compiling with `compile`. See the module docstring."""
  ast = as_optimized(ast)
  timer = timer or _Timer(ast, renderer, compile)
  heur = heuristic_opts(ast, renderer)
  timed: dict[tuple[Opt, ...], float] = {}
  seen: set[UOp] = set()
  beam: list[tuple[Kernel, float]] = []
  for opts in ((), heur):
    k = _kernel_for(ast, renderer, opts)
    if k.ast in seen: continue
    seen.add(k.ast)
    timed[opts] = timer.time(opts)
    beam.append((k, timed[opts]))
  beam.sort(key=lambda c: c[1])
  best = beam[0][1]
  st = time.perf_counter()
  while True:
    cands: list[tuple[Kernel, float]] = []
    for k, _ in beam:
      for act in ACTIONS:
        k2 = k.copy()
        try: k2.apply_opt(act)
        except KernelOptError: continue
        if k2.ast in seen: continue
        seen.add(k2.ast)
        opts = tuple(k2.applied_opts)
        try: t = timer.time(opts, cutoff=CUTOFF * best)
        except Exception as e:  # noqa: BLE001 -- a candidate that fails to compile or run is just not a candidate
          if DEBUG >= 3: print(f"BEAM: {opts} failed: {type(e).__name__}: {e}")
          continue
        timed[opts] = t
        cands.append((k2, t))
    if not cands: break
    cands.sort(key=lambda c: c[1])
    if cands[0][1] >= best: break
    beam, best = cands[:amt], cands[0][1]
    if DEBUG >= 2: print(f"BEAM {time.perf_counter() - st:6.2f}s: {best * 1e6:9.2f} us {beam[0][0].applied_opts}")
  # final: the fastest few and the heuristics' again, in turns; the heuristics' unless clearly beaten
  finalists = [o for o, _ in sorted(timed.items(), key=lambda x: x[1]) if o != heur][:FINALISTS] + [heur]
  final = {o: math.inf for o in finalists}
  for _ in range(3):
    for o in finalists: final[o] = min(final[o], timer.time(o))
  win = min(finalists, key=lambda o: final[o])
  if final[win] > final[heur] * (1 - MARGIN): win = heur
  if DEBUG >= 2: print(f"BEAM final: {final[win] * 1e6:9.2f} us {win} (heuristic {final[heur] * 1e6:9.2f} us)")
  return list(timed.items()), win


def beam_search(ast: UOp, renderer: Renderer, amt: int, *, compile: Compile) -> tuple[Opt, ...]:
  """The fastest opt sequence found with beam width `amt`, never one measured slower than the heuristics' (cached on
  disk under `cache_key`); candidates are compiled with `compile` (`tiny_codegen.get_program`)."""
  ast = as_optimized(ast)
  key = cache_key(ast, renderer, amt)
  if key is not None and not IGNORE_BEAM_CACHE and (hit := diskcache_get("beam", key)) is not None:
    return pickle.loads(hit)
  best = beam_candidates(ast, renderer, amt, compile=compile)[1]
  if key is not None: diskcache_put("beam", key, pickle.dumps(best))
  return best
