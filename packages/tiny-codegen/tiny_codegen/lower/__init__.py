"""The lowering pipeline: a kernel AST (docs/PIPELINE.md §3) to linear UOps (§4) for one renderer.

Stages, in order (each a named pass). `DEBUG>=3` prints the opts applied, `DEBUG>=5` the linear UOps after lowering,
`DEBUG>=6` the kernel AST before it, `DEBUG>=7` the graph after every stage:
  optimize    `tiny_codegen.opt.optimize_kernel` hook (marks UPCAST/UNROLL/LOCAL/... axes)
  bounds      a sum's loop narrowed to where its gated terms (a padded read) can be nonzero
  transcendental  our polynomial exp2/log2/sin for the ops in `renderer.decompose_ops`, on scalars before the
              expander, so an upcast copies their ALU ops into lanes like any other (native vectors on LLVM) where a
              libm call would run lane by lane
  expander    UPCAST/UNROLL ranges -> per-lane copies, simplified in the same rewrite
  reduce      GPU: GROUP_REDUCE axes -> workgroup reduction in shared memory; REDUCE -> DEFINE_REG accumulator + loop
  dims        CPU: outermost loop split across threads (`core_id`); GPU: GLOBAL/LOCAL ranges -> SPECIAL gidx/lidx
  decomp      gates folded, MULACC, BIND, the transcendental rewrite again (for what the decompositions made),
              bfloat16 through float32 where the renderer lacks it, renderer rules
  ends        loops for the stores (END trees)
  simplify    index math through the symbolic simplifier
  linearize   toposort into loop order
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from tiny_uop.device import Renderer
from tiny_uop.dtype import dtypes
from tiny_uop.helpers import DEBUG
from tiny_uop import trace as _trace
from tiny_uop.pattern import PatternMatcher, graph_rewrite
from tiny_uop.spec import kernel_spec, maybe_verify, program_spec
from tiny_uop.uop import KernelInfo, Ops, UOp, print_uops

from tiny_codegen.lower.bounds import gates_to_bounds
from tiny_codegen.lower.decomp import bf16_to_float, pm_decomp, pm_exact_fmod, pm_gates, pm_late
from tiny_codegen.lower.dims import Dims, add_gpudims, add_threads, group_reduces
from tiny_codegen.lower.gather import fold_onehot_reduces
from tiny_codegen.lower.expander import pm_expander, pm_expander_vectors
from tiny_codegen.lower.linearize import linearize
from tiny_codegen.lower.merge import merge_reduce_ranges
from tiny_codegen.lower.reduce import add_ends, lower_reduces
from tiny_codegen.lower.simplify import simplifier, simplify_graph
from tiny_codegen.lower.transcendental import pm_absorbed_exp2, pm_transcendental

if TYPE_CHECKING:  # the optimizer imports lowering pieces (lower.expander): a runtime import here would be circular
  from tiny_codegen.opt import Search

__all__ = ["Lowered", "lower", "STAGES"]


@dataclass
class Lowered:
  """A lowered kernel: its linear UOps and launch dims."""
  uops: list[UOp]
  dims: Dims = field(default_factory=Dims)
  sink: UOp | None = None


@functools.cache
def _expand_and_simplify(vectors: bool) -> PatternMatcher:
  """The expander's rules first, then the index simplifier's: one pass, in which each lane copy the expander makes is
  simplified as the rewrite walks into it (not a second walk over the whole expanded graph)."""
  return (pm_expander_vectors if vectors else pm_expander) + simplifier()


def _fmod(sink: UOp, ren: Renderer) -> UOp:
  """Float CMOD as `decomp.exact_fmod` where the renderer's own fmod is not exact (`ren.exact_fmod` False): before
  the expander, on scalars, like the transcendental polynomials."""
  return sink if getattr(ren, "exact_fmod", True) else graph_rewrite(sink, pm_exact_fmod, name="exact_fmod")


def _transcendental(sink: UOp, ren: Renderer) -> UOp:
  """The pass `transcendental`: EXP2/LOG2/SIN in `ren.decompose_ops` rewritten into tiny's polynomials (scalar ones:
  run before the expander they vectorize with the kernel; run again after the decompositions for what those made),
  float32 through float64 for the ops `ren.transcendental_via_f64` names (True: all), their polynomials as fused
  multiply-adds where `ren.fused_mulacc`; an exp2 added to a constant of magnitude >= 1 without its underflow lanes
  (`pm_absorbed_exp2`, on the way down). Unchanged without any."""
  if not (ops := frozenset(getattr(ren, "decompose_ops", ()))): return sink
  via = getattr(ren, "transcendental_via_f64", False)
  return graph_rewrite(sink, pm_transcendental, (ops, ops if via is True else frozenset(via or ()),
                                                 bool(getattr(ren, "fused_mulacc", False)),
                                                 frozenset(getattr(ren, "ldexp_ops", ()))), name="transcendental",
                       bpm=pm_absorbed_exp2)


def _stage_expander(sink: UOp, ren: Renderer, dims: Dims) -> UOp:
  return graph_rewrite(sink, _expand_and_simplify(bool(ren.vectorize_upcast)), name="expander")


def _stage_reduce(sink: UOp, ren: Renderer, dims: Dims) -> UOp:
  if ren.has_local and ren.has_shared and not ren.has_threads: sink = group_reduces(sink, ren)
  return lower_reduces(sink, itertools.count(), _fma_chains(ren))


def _fma_chains(ren: Renderer) -> int:
  """The accumulators a loop needs before `lower_reduces` chains unrolled lanes into each (its `chains`): on a CPU
  renderer whose expander vectorizes (LLVM), the machine model's `fma_chains`; 0 (never) elsewhere."""
  if not ren.vectorize_upcast or ren.has_local: return 0
  from tiny_codegen.machine import fma_chains, machine_of
  return fma_chains(machine_of(ren))


def _stage_dims(sink: UOp, ren: Renderer, dims: Dims) -> UOp:
  if ren.has_threads: sink, d = add_threads(sink, ren)
  elif ren.has_local: sink, d = add_gpudims(sink, ren)
  else: d = Dims()
  dims.global_size, dims.local_size, dims.cost = d.global_size, d.local_size, d.cost
  return sink


_pm_decomp_gates = pm_decomp + pm_gates


def _stage_decomp(sink: UOp, ren: Renderer, dims: Dims) -> UOp:
  sink = _transcendental(graph_rewrite(sink, _pm_decomp_gates, name="decomp"), ren)
  if dtypes.bfloat16 not in ren.supported_dtypes() or getattr(ren, "bf16_through_float", False):
    sink = bf16_to_float(sink)
  if ren.extra_matcher is not None: sink = graph_rewrite(sink, ren.extra_matcher, name="renderer_rules")
  return sink


def _stage_simplify(sink: UOp, ren: Renderer, dims: Dims) -> UOp:
  sink = graph_rewrite(simplify_graph(sink, name="simplify_index"), pm_gates, name="gates")
  return graph_rewrite(sink, pm_late, name="late_decomp")


STAGES: list[tuple[str, Callable[[UOp, Renderer, Dims], UOp]]] = [
  ("bounds", lambda sink, ren, dims: gates_to_bounds(sink)),
  ("transcendental", lambda sink, ren, dims: _transcendental(_fmod(sink, ren), ren)),
  ("expander", _stage_expander),
  ("reduce", _stage_reduce),
  ("dims", _stage_dims),
  ("decomp", _stage_decomp),
  ("simplify", _stage_simplify),
  ("ends", lambda sink, ren, dims: add_ends(sink)),
]


def pre_optimize(ast: UOp) -> UOp:
  """`ast` as the optimizer sees it (opts name this AST's axes; BEAM starts from it too): gathers written as one-hot
  sums load at the index instead, and a reduce's nested ranges that every index walks as one contiguous run become
  one range. Idempotent: an AST both passes already ran on comes back unchanged."""
  return merge_reduce_ranges(fold_onehot_reduces(ast))


def lower(ast: UOp, renderer: Renderer, optimize: bool = True, search: Search | None = None) -> Lowered:
  """Lower kernel AST `ast` (a SINK of STOREs) for `renderer`: returns the linear UOps and launch dims.
  `optimize=False` skips the optimizer hook (the AST's axis types are lowered as they are); `search` is BEAM's
  (`optimize_kernel`'s argument: `tiny_codegen.get_program` passes it)."""
  if ast.op is not Ops.SINK: raise ValueError(f"lower needs a kernel SINK, got {ast.op}")
  from tiny_codegen.opt import optimize_kernel
  if DEBUG >= 6: print(f"kernel AST:\n{ast}")
  maybe_verify(ast, kernel_spec, "kernel AST")
  ast = pre_optimize(ast)
  sink = optimize_kernel(ast, renderer, search) if optimize else ast
  if DEBUG >= 3 and isinstance(info := sink.arg, KernelInfo): print(f"opts {info.name}: {list(info.applied_opts)}")
  maybe_verify(sink, kernel_spec, "optimized kernel AST")
  dims = Dims()
  for name, fn in STAGES:
    prev, sink = sink, fn(sink, renderer, dims)
    if _trace.RECORDER is not None: _trace.RECORDER.stage(name, prev, sink)  # VIZ
    if DEBUG >= 7: print(f"after {name}:\n{sink}")
  uops = linearize(sink)
  maybe_verify(uops, program_spec, "linear program")
  if DEBUG >= 5: print(print_uops(uops))
  return Lowered(uops, dims, sink)
