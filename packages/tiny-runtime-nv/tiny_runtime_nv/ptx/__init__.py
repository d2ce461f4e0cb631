"""The PTX executor: runs NVIDIA PTX kernels on the CPU, whole warps and blocks at once as numpy lane columns.

It is the GPU of `MOCK+NV` and `MOCK+CUDA`, and the reference the codegen tests run PTXRenderer's kernels on.
A kernel is parsed and compiled once (`load_kernel(ptx, name)`: statements -> closures over lane columns), then
`Kernel.launch(memory, params, grid, block)` runs it against a `Memory` (host ranges registered as GPU memory; an
access outside them raises `GPUFault`). Supported: integer/float ALU incl. f16 and bf16 conversions, predicates and
branches (divergence with per-lane pcs), shared and local memory, `bar.sync`, vector `ld`/`st`, atomics (`atom`,
`red`), `mma.sync` m16n8k16/m16n8k8; an instruction it does not know raises NotImplementedError naming it.

>>> import numpy as np
>>> from tiny_runtime_nv.ptx import run
>>> ptx = '''.version 7.8
... .target sm_90
... .address_size 64
... .visible .entry k(.param .u64 data0) {
...   .reg .b32 %r<2>; .reg .b64 %rd<4>;
...   ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x;
...   mul.wide.u32 %rd2, %r0, 4; add.s64 %rd3, %rd1, %rd2; st.global.u32 [%rd3], %r0; ret; }'''
>>> out = np.zeros(4, np.uint32); _ = run(ptx, "k", [out], (1, 1, 1), (4, 1, 1)); out.tolist()
[0, 1, 2, 3]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tiny_runtime_nv.ptx.executor import Kernel, load_kernel
from tiny_runtime_nv.ptx.memory import GPUFault, Memory
from tiny_runtime_nv.ptx.mma import frag_a, frag_b, frag_c
from tiny_runtime_nv.ptx.parse import PTXParseError

__all__ = ["Kernel", "load_kernel", "Memory", "GPUFault", "PTXParseError", "run", "frag_a", "frag_b", "frag_c"]


def run(ptx: str, name: str, bufs: Sequence[np.ndarray], global_size: Sequence[int],
        local_size: Sequence[int] | None, vals: Sequence[int] = (), globals_: Sequence[int] | None = None) -> Kernel:
  """Run kernel `name` of `ptx` over `global_size` blocks of `local_size` threads on numpy arrays, in place.

  Parameters are the buffers (in `globals_` order: the PARAM slot of each pointer parameter; default 0, 1, ...)
  then the int values `vals`, as PTXRenderer declares them. Returns the compiled kernel."""
  k = load_kernel(ptx, name)
  order = list(globals_) if globals_ is not None else list(range(len(bufs)))
  mem = Memory()
  addrs = []
  for s in order:
    arr = bufs[s]
    if not arr.flags.c_contiguous: raise ValueError(f"buffer {s} is not C-contiguous")
    addr = arr.ctypes.data
    mem.add(addr, arr.nbytes, arr.reshape(-1).view(np.uint8))
    addrs.append(addr)
  k.launch(mem, k.pack_params([*addrs, *vals]), tuple(global_size), tuple(local_size or (1, 1, 1)))
  return k
