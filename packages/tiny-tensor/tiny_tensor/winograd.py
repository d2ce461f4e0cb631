"""Winograd convolution F(m x m, 3 x 3) (Lavin & Gray 2015, "Fast Algorithms for Convolutional Neural Networks"):
a 3x3, stride 1, dilation 1, ungrouped conv as m x m output tiles, each from an n x n input tile (n = m + 2):

  Y = A^T [ (G g G^T) . (B^T d B) ] A     (. : elementwise, summed over input channels)

so a tile's m^2 x 9 multiplies per channel pair become n^2 (m=2: 16 for 36, 2.25x fewer; m=4: 36 for 144, 4x).
Three kernels: the input transform V = B^T d B, laid out (n^2, tiles, Cin) contiguous; the product M = V @ U, a batch
of n^2 matmuls (tiles x Cin) @ (Cin x Cout), U = G g G^T laid out (n^2, Cin, Cout): the CPU heuristics block it as any
matmul, its weight loads contiguous across output channels; and the output transform A^T M A (+ bias), into which a
following elementwise op (ReLU, a residual add) fuses. Everything is Tensor ops, so autograd differentiates it.

The matrices come from their definition (`winograd_matrices`): the Toom-Cook algorithm for a correlation of m outputs
with an r-tap filter, on n - 1 finite interpolation points and infinity. A^T and B^T have small integer entries
(exact in float32); G's are the Lagrange denominators' reciprocals (1/2 for m=2, 1/4 ... 1/24 for m=4), rounded once.

Where it pays (`winograd_tile`) is a rule over the machine model: see its docstring.
"""
from __future__ import annotations

import math
import weakref
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from tiny_codegen.machine import Machine
  from tiny_tensor.tensor import Tensor
  from tiny_uop.uop import UOp

__all__ = ["winograd_matrices", "winograd_weight", "winograd_conv", "winograd_tile", "POINTS"]

POINTS: dict[int, tuple[Fraction, ...]] = {2: (Fraction(0), Fraction(1), Fraction(-1)),
                                           4: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2))}
"""The finite interpolation points per output tile size m (n - 1 = m + 1 of them; the last point is infinity): the
smallest integers, whose powers keep A^T and B^T small (Lavin & Gray's choice)."""

Mat = tuple[tuple[Fraction, ...], ...]


def _inverse(a: list[list[Fraction]]) -> list[list[Fraction]]:
  """Exact inverse of a small nonsingular rational matrix (Gauss-Jordan)."""
  n = len(a)
  aug = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(a)]
  for c in range(n):
    p = next(r for r in range(c, n) if aug[r][c] != 0)
    aug[c], aug[p] = aug[p], aug[c]
    aug[c] = [v / aug[c][c] for v in aug[c]]
    for r in range(n):
      if r != c and aug[r][c] != 0: aug[r] = [v - aug[r][c] * w for v, w in zip(aug[r], aug[c])]
  return [row[n:] for row in aug]


def winograd_matrices(m: int, r: int = 3) -> tuple[Mat, Mat, Mat]:
  """(A^T (m x n), G (n x r), B^T (n x n)) of F(m, r), n = m + r - 1, from `POINTS[m]` and infinity.

  A linear convolution c = g * h (g: r taps, h: m values) is evaluated at the n points (G g and E h: Vandermonde rows
  p^k, infinity's row the leading coefficient), multiplied pointwise and interpolated back (the inverse of the n x n
  Vandermonde V, infinity included). The correlation y_i = sum_k g_k d_(i+k) is that map transposed in h:
  y = E^T [(G g) . (V^-T d)], so A^T = E^T and B^T = V^-T. Each row j of B^T is scaled to coprime integers and row j of
  G divided by the same factor (the product is unchanged): B^T and A^T are then small integers.

  >>> at, g, bt = winograd_matrices(2)
  >>> [[int(v) for v in row] for row in bt]
  [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, -1, 0, 1]]
  """
  n = m + r - 1
  pts = POINTS[m]
  if len(pts) != n - 1: raise ValueError(f"F({m},{r}) needs {n - 1} finite points, POINTS has {len(pts)}")

  def rows(k: int) -> list[list[Fraction]]:  # evaluation of a degree < k polynomial at the points and infinity
    return [[p ** i for i in range(k)] for p in pts] + [[Fraction(int(i == k - 1)) for i in range(k)]]
  vinv = _inverse(rows(n))  # coefficients -> values is rows(n); values -> coefficients its inverse
  bt = [[vinv[i][j] for i in range(n)] for j in range(n)]  # V^-T
  e, g = rows(m), rows(r)
  at = [[e[j][i] for j in range(n)] for i in range(m)]
  for j in range(n):
    den = math.lcm(*(v.denominator for v in bt[j]))
    num = math.gcd(*(int(v * den) for v in bt[j]))
    s = Fraction(den, num)
    bt[j] = [v * s for v in bt[j]]
    g[j] = [v / s for v in g[j]]
  return tuple(map(tuple, at)), tuple(map(tuple, g)), tuple(map(tuple, bt))


def _transform(mat: Mat, t: Tensor) -> Tensor:
  """mat @ t @ mat^T over t's first two axes (each len(mat[0])), as a sum of t's slices per output point (only the
  nonzero coefficients; rows first, shared between the points of a row), stacked: (len(mat)^2, *t.shape[2:])."""
  tensor = type(t)  # (no import of tiny_tensor.tensor: it imports nnops, which imports this module)
  rest = t.shape[2:]

  def at(i: int, j: int) -> Tensor: return t[i, j]

  def lin(terms: list[tuple[Fraction, Tensor]]) -> Tensor:
    out: Tensor | None = None
    for c, v in terms:
      term = v if c == 1 else -v if c == -1 else v * float(c)
      out = term if out is None else out + term
    return out if out is not None else tensor.zeros(*rest, dtype=t.dtype, device=t.device)
  k = len(mat[0])
  rows = [[lin([(c, at(i, j)) for i, c in enumerate(row) if c != 0]) for j in range(k)] for row in mat]
  pts = [lin([(c, rows[a][j]) for j, c in enumerate(row) if c != 0]) for a in range(len(mat)) for row in mat]
  return tensor.stack(*pts, dim=0)


_PREPARED: weakref.WeakKeyDictionary[UOp, int] = weakref.WeakKeyDictionary()
"""The transformed weights `winograd_weight(..., realize=True)` returned (their UOps) and their m."""


def winograd_weight(weight: Tensor, m: int, realize: bool = False) -> Tensor:
  """U = G g G^T of a (Cout, Cin, 3, 3) weight, laid out (n^2, Cin, Cout) contiguous (the product's right matrices).
  `realize`: made now (a fixed weight, e.g. an ONNX initializer, transformed once; `winograd_conv` reads it as is)."""
  _, g, _ = winograd_matrices(m)
  u = _transform(g, weight.permute(2, 3, 1, 0))  # (n^2, Cin, Cout)
  u = u.contiguous()
  if realize:
    u = u.realize()
    _PREPARED[u.uop] = m
  return u


def winograd_conv(x: Tensor, weight: Tensor, bias: Tensor | None, pads: tuple[tuple[int, int], ...], m: int) -> Tensor:
  """The 3x3 stride-1 conv of x (N, Cin, H, W) with `weight` ((Cout, Cin, 3, 3), or its `winograd_weight(.., m)`),
  padded by `pads` ((top, bottom), (left, right)), as F(m x m, 3 x 3): torch's conv2d's numbers, to float rounding."""
  at, _, bt = winograd_matrices(m)
  n = m + 2
  bs, cin, h, w = x.shape
  if (prepared := _PREPARED.get(weight.uop)) is not None and prepared != m:
    raise ValueError(f"the weight was transformed for F({prepared},3), not F({m},3)")
  if prepared is None and tuple(weight.shape[1:]) != (cin, 3, 3):
    raise ValueError(f"a Winograd conv of {tuple(x.shape)} needs a (Cout, {cin}, 3, 3) weight, not {weight.shape}")
  u = weight if prepared is not None else winograd_weight(weight, m)
  cout = u.shape[2]
  (pt, pb), (pl, pr) = pads
  if not isinstance(h, int) or not isinstance(w, int): raise ValueError(f"Winograd needs int spatial sizes: {x.shape}")
  ho, wo = h + pt + pb - 2, w + pl + pr - 2
  if ho < 1 or wo < 1: raise ValueError(f"a 3x3 conv of {tuple(x.shape)} padded by {pads} has no output")
  th, tw = -(-ho // m), -(-wo // m)
  # pad up to whole tiles (the extra rows and columns are zeros, their outputs cropped), then n x n windows every m
  xp = x._pad_dims(((0, 0), (0, 0), (pt, pb + th * m - ho), (pl, pr + tw * m - wo)))
  d = xp._windows((n, n), (m, m), (1, 1)).permute(4, 5, 0, 2, 3, 1)  # (n, n, N, th, tw, Cin)
  v = _transform(bt, d).reshape(n * n, bs * th * tw, cin).contiguous()
  mm = (v @ u).reshape(n, n, bs, th, tw, cout).contiguous()
  y = _transform(at, mm).contiguous().reshape(m, m, bs, th, tw, cout).permute(2, 5, 3, 0, 4, 1)
  y = y.reshape(bs, cout, th * m, tw * m)
  if th * m != ho or tw * m != wo: y = y.shrink(((0, bs), (0, cout), (0, ho), (0, wo)))
  return y if bias is None else y + bias.reshape(1, cout, 1, 1)


MEMORY_LINES_IN_FLIGHT = 16
"""Cache-line misses one core keeps in flight to memory (its L1 miss buffers: 16 on Intel since Ice Lake's fill
buffers, 24 miss-address buffers on Zen 4, 12-20 on Neoverse): with `MEMORY_LATENCY_CYCLES`, what one core streams
from memory, line x in flight / latency bytes a cycle (Little's law). An architectural bound, not a measurement: the
machine model has no bandwidth figure, and none of these files reports one."""

MEMORY_LATENCY_CYCLES = 400
"""A load's latency from memory in core cycles (about 100 ns at 4 GHz: DDR4/DDR5 servers measure 80-120 ns loaded)."""


def _stream_bytes_per_cycle(machine: Machine, size: int) -> float:
  """What one core reads a buffer of `size` bytes at, streamed once: a line a cycle from its L2, half a line from its
  share of the L3 (`Machine.l3_per_core`), and `MEMORY_LINES_IN_FLIGHT` lines per `MEMORY_LATENCY_CYCLES` beyond."""
  if size <= machine.l2: return machine.line
  if size <= machine.l3_per_core: return machine.line / 2
  return machine.line * MEMORY_LINES_IN_FLIGHT / MEMORY_LATENCY_CYCLES


def _nonzeros(mat: Mat) -> float: return sum(1 for row in mat for v in row if v != 0) / len(mat)


def winograd_costs(machine: Machine, bs: int, cin: int, cout: int, ho: int, wo: int,
                   itemsize: int = 4) -> dict[int, float]:
  """Estimated cycles of a 3x3 stride-1 conv of (Cin -> Cout) on `bs` h x w outputs: {0: direct, 2: F(2,3),
  4: F(4,3)}, on one core of `machine` (see `winograd_tile`)."""
  lanes = max(1, machine.fma_units) * max(1, machine.vector_bytes // itemsize)  # FMAs a cycle
  w_bytes = 9 * cin * cout * itemsize
  costs = {0: max(9 * cin * cout * bs * ho * wo / lanes, w_bytes / _stream_bytes_per_cycle(machine, w_bytes))}
  for m in (2, 4):
    n, (at, _, bt) = m + 2, winograd_matrices(m)
    tiles = bs * -(-ho // m) * -(-wo // m)
    u_bytes = n * n * cin * cout * itemsize
    product = max(n * n * tiles * cin * cout / lanes, u_bytes / _stream_bytes_per_cycle(machine, u_bytes))
    # the transforms: per tile and channel B^T d (n x n sums of a row's nonzeros) then . B (as many), A^T M (m x n)
    # then . A (m x m), as vector ops (the kernels store along channels); and V and M each written once and read
    # once, at the rate of the cache level they fit in
    ops = tiles * (cin * 2 * n * n * _nonzeros(bt) + cout * (m * n + m * m) * _nonzeros(at))
    vm_bytes = n * n * tiles * (cin + cout) * itemsize
    costs[m] = product + ops / lanes + 2 * vm_bytes / _stream_bytes_per_cycle(machine, vm_bytes // 2)
  return costs


def winograd_tile(machine: Machine, bs: int, cin: int, cout: int, ho: int, wo: int, itemsize: int = 4) -> int:
  """The m of F(m x m, 3 x 3) for a 3x3 stride-1 conv of (Cin -> Cout) on `bs` images of ho x wo outputs on
  `machine` (0: the direct conv): the cheapest of `winograd_costs`' estimates, one core's cycles of each:
  - the direct conv: its 9 Cin Cout multiplies per output at the FMA rate (fma_units x vector lanes a cycle), or its
    weight streamed once, whichever is longer;
  - F(m,3): the product's n^2 Cin Cout multiplies per tile at that rate, or its transformed weight (n^2/9 the
    weight's bytes: 16/9 for m=2, 36/9 for m=4) streamed once, from the cache level it fits in
    (`_stream_bytes_per_cycle`), whichever is longer; plus the transforms: a vector op per nonzero coefficient, and
    their transformed tiles' bytes (V and M) written and read back.
  Against one thread of a Zen 4 (resnet18's 3x3 convs, measured: direct 1.8-2.0 ms each), the estimates' ratios to the
  direct conv's were within 1.5x of the measured ones (bench/README.md, wt-wino).
  A small map with many channels (resnet18's 7x7 stage, 512 channels: a 9.4 MB weight, 37.7 MB transformed for
  F(4,3)) has few tiles to reuse each transformed weight over and is bound by its bytes: direct there."""
  costs = winograd_costs(machine, bs, cin, cout, ho, wo, itemsize)
  return min(costs, key=lambda k: (costs[k], k))
