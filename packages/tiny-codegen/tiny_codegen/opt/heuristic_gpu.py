"""Hand-coded optimizations for GPU renderers (`has_local`): a workgroup per block of outputs.

- under `TC=1`, a matmul whose dtypes and shape fit one of the renderer's tensor cores gets TC (and nothing else);
- otherwise the CPU register blocking and reduce unroll, then a LOCAL split of the innermost output axis.
"""
from __future__ import annotations

from tiny_uop.helpers import USE_TC
from tiny_uop.uop import Ops

from tiny_codegen.opt.heuristic import _output_axes_with_bounds, _register_block, _store_index, _try, _unroll_reduce
from tiny_codegen.opt.kernel import Kernel, Opt, OptOps


def gpu_hand_coded_optimizations(k: Kernel) -> Kernel:
  """Apply the GPU heuristic opts to `k` (in place) and return it."""
  has_reduce = any(u.op is Ops.REDUCE for u in k.ast.toposort())
  # a matmul of tensor-core dtypes and shape: one warp per tile (TC takes the whole kernel; nothing applies after it)
  if USE_TC and has_reduce and k.renderer.tensor_cores and not k.applied_opts and _try(k, Opt(OptOps.TC, 0, -1)):
    return k
  if has_reduce:
    _register_block(k, _store_index(k), k.loads())
    _unroll_reduce(k, k.loads())
  _add_locals(k)
  return k


def _add_locals(k: Kernel) -> None:
  """Split the innermost output axis into a workgroup of up to 16 threads."""
  axes = _output_axes_with_bounds(k)
  if not axes: return
  i, _, n = axes[-1]
  for amt in (16, 8, 4, 2):
    if n % amt == 0 and _try(k, Opt(OptOps.LOCAL, i, amt)): return
