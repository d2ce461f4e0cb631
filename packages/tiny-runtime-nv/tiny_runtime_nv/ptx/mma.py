"""Warp-wide `mma.sync.aligned.m16n8k{8,16}.row.col.f32.{f16,bf16}.{f16,bf16}.f32` over whole lane columns.

Where each element of A (16 x k, row-major), B (k x 8, column-major) and C/D (16 x 8) sits in the 32 lanes of a
warp is given by the PTX ISA figures "Matrix Fragments for mma.m16n8k16 with floating point type" and "... for
mma.m16n8k8": with groupID = laneid >> 2 and threadID_in_group = laneid % 4,
- A (k=16): a0..a7 (two halves per .b32 register, the low half first); row = groupID for a0, a1, a4, a5 and
  groupID + 8 for a2, a3, a6, a7; col = threadID_in_group * 2 + (i & 1), + 8 for a4..a7.
  A (k=8): a0..a3; row = groupID for a0, a1, groupID + 8 for a2, a3; col = threadID_in_group * 2 + (i & 1).
- B: b_i row = threadID_in_group * 2 + (i & 1) (+ 8 for b2, b3 when k=16), col = groupID.
- C/D (float32): c0..c3; row = groupID for c0, c1, groupID + 8 for c2, c3; col = threadID_in_group * 2 + (i & 1).
All warps of the launch are computed at once (batched matmul in float64, rounded to float32 once).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from tiny_runtime_nv.ptx.values import bf16_to_f32


def frag_a(k: int, i: int, lane: int) -> tuple[int, int]:
  """(row, col) in A of element `i` held by `lane`."""
  g, t = lane >> 2, lane % 4
  if k == 16: return (g if i in (0, 1, 4, 5) else g + 8, t * 2 + (i & 1) + (8 if i >= 4 else 0))
  return (g if i < 2 else g + 8, t * 2 + (i & 1))


def frag_b(k: int, i: int, lane: int) -> tuple[int, int]:
  """(row, col) in B of element `i` held by `lane`."""
  g, t = lane >> 2, lane % 4
  return (t * 2 + (i & 1) + (8 if k == 16 and i >= 2 else 0), g)


def frag_c(i: int, lane: int) -> tuple[int, int]:
  """(row, col) in C and D of element `i` held by `lane`."""
  g, t = lane >> 2, lane % 4
  return (g if i < 2 else g + 8, t * 2 + (i & 1))


def _flat(k: int, cols: int, f: Callable[[int, int], tuple[int, int]], n: int) -> np.ndarray:
  """Flat (row * cols + col) position of element i of each lane: shape (32, n)."""
  return np.array([[r * cols + c for r, c in (f(i, ln) for i in range(n))] for ln in range(32)])


def compile_mma(comp: Any, p: list[str], a: list[str]) -> Callable[[Any, Any], None]:
  """The closure for one `mma.sync` statement (see the module docstring); other shapes/types raise by name."""
  name = ".".join(p)
  m = re.fullmatch(r"mma\.sync\.aligned\.m16n8k(8|16)\.row\.col\.f32\.(f16|bf16)\.(f16|bf16)\.f32", name)
  if m is None or m.group(2) != m.group(3) or (m.group(1) == "8" and m.group(2) == "bf16"):
    raise NotImplementedError(f"PTX executor: unsupported {name}")
  k, tin = int(m.group(1)), m.group(2)
  regs = [[x.strip() for x in arg.strip().strip("{}").split(",")] for arg in a]
  d, ra, rb, rc = regs
  if (len(ra), len(rb), len(rc), len(d)) != ((4, 2, 4, 4) if k == 16 else (2, 1, 4, 4)):
    raise ValueError(f"{name}: operand sizes {len(d)}/{len(ra)}/{len(rb)}/{len(rc)} don't match the shape")
  na, nb = 2 * len(ra), 2 * len(rb)
  ia, ib, ic = (_flat(k, k, lambda i, ln: frag_a(k, i, ln), na), _flat(k, 8, lambda i, ln: frag_b(k, i, ln), nb),
                _flat(k, 8, frag_c, 4))
  sa, sb = [comp.src(r, "b32") for r in ra], [comp.src(r, "b32") for r in rb]
  sc = [comp.src(r, "f32") for r in rc]
  outs = [comp.writer(r) for r in d]

  def halves(c: Any, srcs: list) -> np.ndarray:  # (warps, 32, 2 * regs) element values, low half first
    cols = []
    for s in srcs:
      x = np.broadcast_to(np.asarray(s(c.R), np.uint32), (c.L,))
      cols += [(x & np.uint32(0xFFFF)).astype(np.uint16), (x >> np.uint32(16)).astype(np.uint16)]
    bits = np.stack(cols, axis=1)
    vals = bits.view(np.float16).astype(np.float64) if tin == "f16" else bf16_to_f32(bits).astype(np.float64)
    return vals.reshape(-1, 32, len(cols))

  def run(c: Any, mask: Any) -> None:
    if c.block_threads % 32:
      raise RuntimeError(f"{name}: needs whole warps of 32 active lanes (block of {c.block_threads} threads)")
    if mask is not None and (mask.reshape(-1, 32).any(axis=1) != mask.reshape(-1, 32).all(axis=1)).any():
      raise RuntimeError(f"{name}: executed by part of a warp (mma.sync.aligned needs all 32 lanes)")
    W = c.L // 32
    A, B, C = np.zeros((W, 16 * k)), np.zeros((W, k * 8)), np.zeros((W, 128))
    va, vb = halves(c, sa), halves(c, sb)
    vc = np.stack([np.broadcast_to(np.asarray(s(c.R), np.float32), (c.L,)) for s in sc], axis=1).reshape(W, 32, 4)
    A[:, ia.reshape(-1)] = va.reshape(W, -1)
    B[:, ib.reshape(-1)] = vb.reshape(W, -1)
    C[:, ic.reshape(-1)] = vc.reshape(W, -1).astype(np.float64)
    D = (A.reshape(W, 16, k) @ B.reshape(W, k, 8) + C.reshape(W, 16, 8)).astype(np.float32).reshape(W, 128)
    vd = D[:, ic.reshape(-1)].reshape(W * 32, 4)
    for i, o in enumerate(outs): o(c, vd[:, i], mask)
  return run
