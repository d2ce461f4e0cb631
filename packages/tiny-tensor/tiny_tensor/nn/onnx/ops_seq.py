"""ONNX recurrent networks (RNN, GRU, LSTM), DFT, grids (AffineGrid, Col2Im), BitCast and TensorScatter."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tiny_uop.dtype import dtypes
from tiny_tensor.nn.onnx.base import _DTYPES, OnnxError
from tiny_tensor.nn.onnx.ops import _axis, _ints, _item, _np, _opt, op
from tiny_tensor.tensor import Tensor

_ACT: dict[str, Callable[..., Tensor]] = {
  "Sigmoid": lambda x, a, b: x.sigmoid(), "Tanh": lambda x, a, b: x.tanh(), "Relu": lambda x, a, b: x.relu(),
  "LeakyRelu": lambda x, a, b: (x < 0).where(x * a, x), "ThresholdedRelu": lambda x, a, b: (x > a).where(x, 0),
  "ScaledTanh": lambda x, a, b: a * (x * b).tanh(), "HardSigmoid": lambda x, a, b: (a * x + b).clip(0, 1),
  "Elu": lambda x, a, b: (x < 0).where(a * (x.exp() - 1), x), "Softsign": lambda x, a, b: x / (1 + x.abs()),
  "Softplus": lambda x, a, b: (1 + x.exp()).log(), "Affine": lambda x, a, b: a * x + b,
}
_ACT_DEFAULT_ALPHA = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "HardSigmoid": 0.2, "Elu": 1.0, "ScaledTanh": 1.0,
                      "Affine": 1.0}
_ACT_DEFAULT_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0, "Affine": 0.0}


def _activations(attrs: dict, n_per_dir: int, defaults: list[str], nd: int) -> list[list[Callable]]:
  names = attrs.get("activations") or defaults * nd
  alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
  fns = []
  for i, nm in enumerate(names):
    if nm not in _ACT: raise OnnxError(f"recurrent activation {nm!r} is not supported; supported: {sorted(_ACT)}")
    a = alphas[i] if i < len(alphas) else _ACT_DEFAULT_ALPHA.get(nm, 0.0)
    b = betas[i] if i < len(betas) else _ACT_DEFAULT_BETA.get(nm, 0.0)
    fns.append(lambda x, f=_ACT[nm], a=a, b=b: f(x, a, b))
  return [fns[d * n_per_dir:(d + 1) * n_per_dir] for d in range(nd)]


def _recurrent(kind: str) -> Callable:
  gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]

  def run(ctx: Any, inp: list, attrs: dict) -> tuple:
    x, w, r = inp[0], inp[1], inp[2]
    b, seq_lens, h0 = _opt(inp, 3), _opt(inp, 4), _opt(inp, 5)
    c0, peep = (_opt(inp, 6), _opt(inp, 7)) if kind == "LSTM" else (None, None)
    layout = attrs.get("layout", 0)
    if layout: x = x.permute(1, 0, 2)                                  # -> (seq, batch, input)
    seq, batch = x.shape[0], x.shape[1]
    hs = attrs.get("hidden_size", w.shape[1] // gates)
    direction = attrs.get("direction", "forward")
    nd = 2 if direction == "bidirectional" else 1
    acts = _activations(attrs, {"RNN": 1, "GRU": 2, "LSTM": 3}[kind],
                        {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind], nd)
    clip = attrs.get("clip")
    lens = _ints(seq_lens) if seq_lens is not None else [seq] * batch
    ys, hns, cns = [], [], []
    for d in range(nd):
      rev = direction == "reverse" or d == 1
      wd, rd = w[d], r[d]                                               # (gates*hs, in), (gates*hs, hs)
      bd = b[d] if b is not None else Tensor.zeros(2 * gates * hs, device=x.device, dtype=x.dtype)
      wb, rb = bd[:gates * hs], bd[gates * hs:]
      h = h0[d] if h0 is not None else Tensor.zeros(batch, hs, device=x.device, dtype=x.dtype)
      c = (c0[d] if c0 is not None else Tensor.zeros(batch, hs, device=x.device, dtype=x.dtype)) if kind == "LSTM" \
        else None
      pd = peep[d] if peep is not None else None
      f = acts[d]
      outs: list[Tensor | None] = [None] * seq
      for step in range(seq):
        t = seq - 1 - step if rev else step
        valid = Tensor(np.array([t < n for n in lens]).reshape(batch, 1), device=x.device)
        if rev: valid = Tensor(np.array([t < n for n in lens]).reshape(batch, 1), device=x.device)
        xt = x[t]
        g = xt @ wd.T + wb
        def clipped(v: Tensor) -> Tensor: return v.clip(-clip, clip) if clip is not None else v
        if kind == "RNN": h_new = f[0](clipped(g + h @ rd.T + rb))
        elif kind == "GRU":
          z = f[0](clipped(g[:, :hs] + h @ rd[:hs].T + rb[:hs]))
          rr = f[0](clipped(g[:, hs:2 * hs] + h @ rd[hs:2 * hs].T + rb[hs:2 * hs]))
          if attrs.get("linear_before_reset", 0):
            hh = f[1](clipped(g[:, 2 * hs:] + rr * (h @ rd[2 * hs:].T + rb[2 * hs:])))
          else: hh = f[1](clipped(g[:, 2 * hs:] + (rr * h) @ rd[2 * hs:].T + rb[2 * hs:]))
          h_new = (1 - z) * hh + z * h
        else:
          assert c is not None
          gg = g + h @ rd.T + rb
          i_, o_, f_, c_ = (gg[:, k * hs:(k + 1) * hs] for k in range(4))
          if pd is not None:
            i_, f_ = i_ + pd[:hs] * c, f_ + pd[2 * hs:] * c
          i_ = f[0](clipped(i_))
          f_ = 1 - i_ if attrs.get("input_forget", 0) else f[0](clipped(f_))
          c_new = f_ * c + i_ * f[1](clipped(c_))
          if pd is not None: o_ = o_ + pd[hs:2 * hs] * c_new
          h_new = f[0](clipped(o_)) * f[2](c_new)
          c = valid.where(c_new, c)
        h = valid.where(h_new, h)
        outs[t] = valid.where(h_new, 0)
      ys.append(Tensor.stack(*[o for o in outs if o is not None]))     # (seq, batch, hs)
      hns.append(h)
      if c is not None: cns.append(c)
    y = Tensor.stack(*ys, dim=1)                                        # (seq, nd, batch, hs)
    yh = Tensor.stack(*hns)                                             # (nd, batch, hs)
    yc = Tensor.stack(*cns) if cns else None
    if layout:
      y, yh = y.permute(2, 0, 1, 3), yh.permute(1, 0, 2)
      if yc is not None: yc = yc.permute(1, 0, 2)
    return (y, yh, yc) if kind == "LSTM" else (y, yh)
  return run


for _k in ("RNN", "GRU", "LSTM"): op(_k)(_recurrent(_k))


@op("DFT")
def dft(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  n_in = _opt(inp, 1)
  if ctx.opset < 20: ax = attrs.get("axis", 1)
  else: ax = int(_item(_opt(inp, 2))) if _opt(inp, 2) is not None else -2
  ax = _axis(ax, x.ndim)                                  # an axis of x; the same axis of re/im (x less its last dim)
  inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
  if x.shape[-1] == 1: re, im = x[..., 0], None
  else: re, im = x[..., 0], x[..., 1]
  if n_in is not None and n_in.numel(): n = int(_item(n_in))
  else: n = 2 * (re.shape[ax] - 1) if inverse and onesided else re.shape[ax]
  m_in = n // 2 + 1 if inverse and onesided else n   # samples read along ax
  def fit(v: Tensor) -> Tensor:  # zero-pad or cut the signal to m_in samples along ax
    m = v.shape[ax]
    if m > m_in: return v.shrink(tuple((0, m_in) if i == ax else None for i in range(v.ndim)))
    if m < m_in: return v.pad(tuple((0, m_in - m) if i == ax else (0, 0) for i in range(v.ndim)))
    return v
  ret = fit(re).cast(dtypes.float32).transpose(ax, -1)
  imt = fit(im).cast(dtypes.float32).transpose(ax, -1) if im is not None else None
  if inverse and onesided:  # irfft: the half spectrum stands for the Hermitian-symmetric whole one
    k = np.arange(m_in)
    w = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0)
    ang = 2 * np.pi * np.outer(k, np.arange(n)) / n                # (m_in, n)
    c = Tensor((w[:, None] * np.cos(ang) / n).astype(np.float32), device=x.device)
    s_ = Tensor((w[:, None] * np.sin(ang) / n).astype(np.float32), device=x.device)
    # numpy's irfft ignores the imaginary parts of the DC and Nyquist terms: sin is 0 there anyway
    out = ret @ c - (imt @ s_ if imt is not None else 0)
    return out.transpose(ax, -1).unsqueeze(-1).cast(x.dtype)
  k_out = n // 2 + 1 if onesided else n
  ang = (2 if inverse else -2) * np.pi * np.outer(np.arange(k_out), np.arange(n)) / n   # (k_out, n)
  cos = Tensor(np.cos(ang).T.astype(np.float32), device=x.device)
  sin = Tensor(np.sin(ang).T.astype(np.float32), device=x.device)
  out_re = ret @ cos - (imt @ sin if imt is not None else 0)
  out_im = ret @ sin + (imt @ cos if imt is not None else 0)
  if inverse: out_re, out_im = out_re / n, out_im / n
  out = out_re.transpose(ax, -1).unsqueeze(-1).cat(out_im.transpose(ax, -1).unsqueeze(-1), dim=-1)
  return out.cast(x.dtype)


@op("BitCast")
def bitcast(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, dt = inp[0], _DTYPES.get(attrs["to"])
  if dt is None or attrs["to"] in (17, 18, 19, 20, 21, 22, 23, 24, 25, 26):
    raise OnnxError(f"BitCast to ONNX type {attrs['to']} is not supported")
  if dt.itemsize != x.dtype.itemsize:
    raise OnnxError(f"BitCast needs equal bit widths: {x.dtype} -> {dt}")
  if x.dtype == dtypes.bool: return x.cast(dtypes.uint8).bitcast(dt)
  if dt == dtypes.bool: return x.bitcast(dtypes.uint8).ne(0)
  return x.bitcast(dt)


@op("AffineGrid")
def affine_grid(ctx: Any, inp: list, attrs: dict) -> Tensor:
  theta, size = inp[0], _ints(inp[1])
  ac = attrs.get("align_corners", 0)
  sp = size[2:]
  axes = []
  for n in sp:
    a = np.linspace(-1, 1, n) if ac else (np.arange(n) * 2 + 1) / n - 1
    axes.append(a if n > 1 or not ac else np.zeros(1))
  mesh = np.meshgrid(*axes, indexing="ij")                         # (D,) H, W
  coords = [m.reshape(-1) for m in mesh][::-1]                     # x first
  base = np.stack(coords + [np.ones_like(coords[0])], 1).astype(np.float32)  # (P, nd+1)
  g = Tensor(base, device=theta.device).cast(theta.dtype) @ theta.transpose(1, 2)   # (N, P, nd)
  return g.reshape(size[0], *sp, len(sp))


@op("Col2Im")
def col2im(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, img, blk = inp[0], _ints(inp[1]), _ints(inp[2])
  nd = len(img)
  dil, strides = attrs.get("dilations", [1] * nd), attrs.get("strides", [1] * nd)
  pads = attrs.get("pads", [0] * 2 * nd)
  n, ck, L = x.shape
  c = ck // int(np.prod(blk))
  padded = [i + pads[d] + pads[d + nd] for d, i in enumerate(img)]
  outs = [(p - (dd * (k - 1) + 1)) // s + 1 for p, dd, k, s in zip(padded, dil, blk, strides)]
  # scatter matrix: (L * prod(blk)) columns onto prod(padded) pixels, built on the host
  P = int(np.prod(padded))
  rows = []
  for li in np.ndindex(*outs):
    for ki in np.ndindex(*blk):
      pos = [o * s + k * dd for o, s, k, dd in zip(li, strides, ki, dil)]
      rows.append(np.ravel_multi_index(pos, padded))
  m = np.zeros((int(np.prod(blk)) * L, P), np.float32)
  # column order of x: channel-major (c, *blk), then L blocks; rows above are (L, blk)
  order = np.array(rows).reshape(L, -1)                             # (L, K)
  for blk_i in range(L):
    for k in range(order.shape[1]): m[k * L + blk_i, order[blk_i, k]] = 1
  y = x.reshape(n, c, -1).cast(dtypes.float32) @ Tensor(m, device=x.device)  # (n, c, P)
  y = y.reshape(n, c, *padded)
  y = y.shrink((None, None) + tuple((pads[d], pads[d] + img[d]) for d in range(nd)))
  return y.cast(x.dtype)


@op("TensorScatter")
def tensor_scatter(ctx: Any, inp: list, attrs: dict) -> Tensor:
  cache, upd, wi = inp[0], inp[1], _opt(inp, 2)
  ax = _axis(attrs.get("axis", -2), cache.ndim)
  mode = attrs.get("mode", "linear")
  n, s = cache.shape[ax], upd.shape[ax]
  b = cache.shape[0]
  starts = _ints(wi) if wi is not None else [0] * b
  for bi, w in enumerate(starts):  # onnxruntime refuses these (a linear write must fit in the cache)
    if not 0 <= w < n or (mode == "linear" and w + s > n):
      top = n - 1 if mode != "linear" else n - s
      raise ValueError(f"TensorScatter write_indices[{bi}] = {w}: valid are 0 .. {top} ({mode} mode, a cache of {n} "
                       f"positions along axis {ax}, {s} update positions)")
  # for every batch row: which update row lands at each cache position (one-hot over s), built on the host
  sel = np.zeros((b, n, s), np.float32)
  hit = np.zeros((b, n), bool)
  for bi in range(b):
    for j in range(s):
      p = starts[bi] + j
      if mode == "circular": p %= n
      if 0 <= p < n: sel[bi, p, j], hit[bi, p] = 1, True
  shp = [1] * cache.ndim
  shp[0] = b
  u = upd.transpose(ax, -1).unsqueeze(-2)                          # (..., 1, s)
  selt = Tensor(sel, device=cache.device).reshape(b, *[1] * (cache.ndim - 2), n, s)
  moved = (u * selt).sum(-1).transpose(ax, -1) if ax != cache.ndim - 1 else (u * selt).sum(-1)
  hmask = Tensor(hit, device=cache.device).reshape(b, *[1] * (ax - 1), n, *[1] * (cache.ndim - ax - 1))
  return hmask.where(moved.cast(cache.dtype), cache)


_ = (math, _np)


# ***** GridSample: the sampling matrix is built on the host from the grid, applied as a matmul *****
def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
  """Reflect coordinates into [lo, hi] (the onnx reference's _gs_reflect, elementwise)."""
  rng = hi - lo
  out = v.copy()
  below, above = v < lo, v > hi
  for mask, dist, near, far in ((below, lo - v, lo, hi), (above, v - hi, hi, lo)):
    n = np.floor(dist / rng) if rng > 0 else np.zeros_like(dist)
    r = dist - n * rng
    even = (n % 2) == 0
    sign = 1 if near == lo else -1
    out = np.where(mask & even, near + sign * r, out)
    out = np.where(mask & ~even, far - sign * r, out)
  return out


def _cubic_coeffs(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
  """Keys' cubic weights of the taps at -1, 0, 1, 2 for fractional offsets t."""
  def k(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
  return [k(t + 1), k(t), k(1 - t), k(2 - t)]


@op("GridSample")
def grid_sample(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, grid = inp
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(attrs.get("mode", "linear"), attrs.get("mode", "linear"))
  pad, ac = attrs.get("padding_mode", "zeros"), attrs.get("align_corners", 0)
  n, c, dims = x.shape[0], x.shape[1], tuple(x.shape[2:])
  g = _np(grid).astype(np.float64)                                 # (N, *out, nd), last axis x first
  out_sp, nd = g.shape[1:-1], len(dims)
  pts = g.reshape(n, -1, nd)[..., ::-1]                            # coordinates in dim order
  p_in, p_out = int(np.prod(dims)), pts.shape[1]
  w = np.zeros((n, p_in, p_out), np.float32)
  for b in range(n):
    taps_per_dim = []
    for d, size in enumerate(dims):
      v = (pts[b, :, d] + 1) / 2 * (size - 1) if ac else ((pts[b, :, d] + 1) * size - 1) / 2
      lo, hi = (0.0, size - 1.0) if ac else (-0.5, size - 0.5)
      if mode == "nearest": v = np.rint(v)
      out_of = (v < lo) | (v > hi)
      if pad == "border": v = np.where(out_of, np.clip(v, 0, size - 1), v)
      elif pad == "reflection": v = np.where(out_of, _reflect(v, lo, hi), v)
      if mode == "nearest": taps = [(v.astype(np.int64), np.ones_like(v))]
      else:
        f = np.floor(v)
        t = v - f
        if mode == "linear": taps = [(f.astype(np.int64), 1 - t), (f.astype(np.int64) + 1, t)]
        else: taps = [(f.astype(np.int64) + o, cf) for o, cf in zip((-1, 0, 1, 2), _cubic_coeffs(t))]
      fixed = []
      for idx, wt in taps:  # the pixel each tap reads under the padding mode (zeros: none outside)
        if pad == "zeros": ok = (idx >= 0) & (idx < size)
        else:
          if pad == "reflection": idx = _reflect(idx.astype(np.float64), lo, hi).astype(np.int64)
          idx, ok = np.clip(idx, 0, size - 1), np.ones_like(idx, bool)
        fixed.append((np.clip(idx, 0, size - 1), np.where(ok, wt, 0.0)))
      taps_per_dim.append(fixed)
    strides = np.cumprod((1,) + dims[::-1])[::-1][1:]
    for combo in np.ndindex(*[len(t) for t in taps_per_dim]):
      flat, wt = np.zeros(p_out, np.int64), np.ones(p_out)
      for d, k in enumerate(combo):
        idx, wk = taps_per_dim[d][k]
        flat, wt = flat + idx * int(strides[d]), wt * wk
      np.add.at(w[b], (flat, np.arange(p_out)), wt)
  y = x.reshape(n, c, p_in).cast(dtypes.float32) @ Tensor(w, device=x.device)
  return y.reshape(n, c, *out_sp).cast(x.dtype)
