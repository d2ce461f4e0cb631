"""ONNX neural-network operators: convolution, pooling, normalization, resampling, attention, losses, quantization."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tiny_uop.dtype import dtypes, to_numpy
from tiny_tensor.nn.onnx.base import _DTYPES, OnnxError
from tiny_tensor.nn.onnx.ops import _axis, _ints, _is_float, _item, _np, _opt, cast_to, op
from tiny_tensor.tensor import Tensor


# ***** convolution and pooling *****
def _auto_pads(attrs: dict, in_: tuple, k_: tuple, s_: tuple, d_: tuple) -> list[tuple[int, int]]:
  """(begin, end) padding per spatial dim from `pads` or `auto_pad` (SAME_UPPER puts the odd one at the end)."""
  nd = len(k_)
  ap = attrs.get("auto_pad", "NOTSET")
  if ap in ("SAME_UPPER", "SAME_LOWER"):
    out = []
    for i, k, s, d in zip(in_, k_, s_, d_):
      total = max((-(-i // s) - 1) * s + (k - 1) * d + 1 - i, 0)
      small = total // 2
      out.append((small, total - small) if ap == "SAME_UPPER" else (total - small, small))
    return out
  if ap == "VALID": return [(0, 0)] * nd
  p = attrs.get("pads", [0] * (2 * nd))
  return [(p[i], p[i + nd]) for i in range(nd)]


def _flat_pads(pairs: list[tuple[int, int]]) -> tuple[int, ...]:
  """Per-dim (begin, end) pairs as torch's flat padding, last dim first."""
  return tuple(v for b, e in reversed(pairs) for v in (b, e))


def _kernel_shape(attrs: dict, w: Tensor, op_type: str) -> tuple:
  """The kernel's spatial shape: the weight's; a `kernel_shape` attribute must agree with it (onnxruntime refuses
  one that doesn't)."""
  k_ = tuple(w.shape[2:])
  if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != k_:
    raise ValueError(f"{op_type}: attribute kernel_shape={list(attrs['kernel_shape'])} contradicts the weight's "
                     f"shape {list(w.shape)} (its spatial dims are {list(k_)}); fix or drop the attribute")
  return k_


@op("Conv")
def conv(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, w, b = inp[0], inp[1], _opt(inp, 2)
  k_ = _kernel_shape(attrs, w, "Conv")
  nd = len(k_)
  s_, d_ = tuple(attrs.get("strides", [1] * nd)), tuple(attrs.get("dilations", [1] * nd))
  pads = _auto_pads(attrs, tuple(x.shape[2:]), k_, s_, d_)
  if x.ndim == 4 and x.shape[1] == getattr(w, "shape", (0, 0))[1]:  # (a mismatch: conv2d's error names it)
    m, u = ctx.winograd(x, w, 1, attrs, pads)
    if m:
      from tiny_tensor.winograd import winograd_conv
      return winograd_conv(x, u, b, tuple(pads), m)
  w = ctx.conv_weight(w, 1)
  return x.conv2d(w, b, groups=attrs.get("group", 1), stride=s_, dilation=d_, padding=_flat_pads(pads))


@op("ConvTranspose")
def conv_transpose(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, w, b = inp[0], inp[1], _opt(inp, 2)
  k_ = _kernel_shape(attrs, w, "ConvTranspose")
  nd = len(k_)
  s_, d_ = tuple(attrs.get("strides", [1] * nd)), tuple(attrs.get("dilations", [1] * nd))
  op_ = list(attrs.get("output_padding", [0] * nd))
  in_ = tuple(x.shape[2:])
  ap = attrs.get("auto_pad", "NOTSET")
  if "output_shape" in attrs or ap in ("SAME_UPPER", "SAME_LOWER"):
    outs = attrs["output_shape"][-nd:] if "output_shape" in attrs else [i * s for i, s in zip(in_, s_)]
    pads = []
    for i, k, s, d, o, want in zip(in_, k_, s_, d_, op_, outs):
      total = s * (i - 1) + o + (k - 1) * d + 1 - want
      if total < 0:  # the requested shape is larger: extend with output padding
        pads.append((0, 0))
        continue
      pads.append((total - total // 2, total // 2) if ap == "SAME_LOWER" else (total // 2, total - total // 2))
    full = [s * (i - 1) + (k - 1) * d + 1 - pb - pe for i, s, k, d, (pb, pe) in zip(in_, s_, k_, d_, pads)]
    op_ = [max(want - f, 0) for want, f in zip(outs, full)]
  else:
    p = attrs.get("pads", [0] * (2 * nd)) if ap != "VALID" else [0] * (2 * nd)
    pads = [(p[i], p[i + nd]) for i in range(nd)]
  extra = [max(o - max(s, d) + 1, 0) for o, s, d in zip(op_, s_, d_)]  # output padding tiny can't take directly
  y = x.conv_transpose2d(w, b, groups=attrs.get("group", 1), stride=s_, dilation=d_, padding=_flat_pads(pads),
                         output_padding=tuple(o - e for o, e in zip(op_, extra)))
  if any(extra): y = y.pad(((0, 0), (0, 0)) + tuple((0, e) for e in extra))
  return y


def _pool_setup(x: Tensor, attrs: dict) -> tuple:
  k_ = tuple(attrs["kernel_shape"])
  nd = len(k_)
  s_, d_ = tuple(attrs.get("strides", [1] * nd)), tuple(attrs.get("dilations", [1] * nd))
  return k_, s_, d_, _auto_pads(attrs, tuple(x.shape[2:]), k_, s_, d_)


@op("AveragePool")
def average_pool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  k_, s_, d_, pads = _pool_setup(x, attrs)
  cip = bool(attrs.get("count_include_pad", 0))
  if attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"): cip = False
  return x.avg_pool2d(k_, s_, d_, _flat_pads(pads), ceil_mode=bool(attrs.get("ceil_mode", 0)),
                      count_include_pad=cip)


@op("MaxPool")
def max_pool(ctx: Any, inp: list, attrs: dict) -> Any:
  x = inp[0]
  k_, s_, d_, pads = _pool_setup(x, attrs)
  ceil = bool(attrs.get("ceil_mode", 0))
  if len(ctx.node.output) < 2 or not ctx.node.output[1]:
    return x.max_pool2d(k_, s_, d_, _flat_pads(pads), ceil_mode=ceil)
  out, idx = x.max_pool2d(k_, s_, d_, _flat_pads(pads), ceil_mode=ceil, return_indices=True)
  sp = tuple(x.shape[2:])
  idx = idx.cast(dtypes.int64)
  if attrs.get("storage_order", 0):  # column-major within the spatial dims (2-D)
    h, w = sp
    idx = (idx % w) * h + idx // w
  n, c = x.shape[:2]
  base = Tensor.arange(n * c, device=x.device).cast(dtypes.int64).reshape(n, c, *[1] * len(sp)) * int(np.prod(sp))
  return out, idx + base


@op("LpPool")
def lp_pool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  k_, s_, d_, pads = _pool_setup(x, attrs)
  p = attrs.get("p", 2)
  s = (x.abs() ** p).avg_pool2d(k_, s_, d_, _flat_pads(pads), ceil_mode=bool(attrs.get("ceil_mode", 0)),
                                count_include_pad=True) * int(np.prod(k_))
  return s ** (1.0 / p)


@op("GlobalAveragePool")
def global_average_pool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return x.mean(tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalMaxPool")
def global_max_pool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return x.max(tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalLpPool")
def global_lp_pool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, p = inp[0], attrs.get("p", 2)
  return (x.abs() ** p).sum(tuple(range(2, x.ndim)), keepdim=True) ** (1.0 / p)


@op("MaxUnpool")
def max_unpool(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx, out_shape = inp[0], inp[1], _opt(inp, 2)
  k_ = tuple(attrs["kernel_shape"])
  nd = len(k_)
  s_ = tuple(attrs.get("strides", [1] * nd))
  p = attrs.get("pads", [0] * (2 * nd))
  outs = [(i - 1) * s - p[j] - p[j + nd] + k for j, (i, s, k) in enumerate(zip(x.shape[2:], s_, k_))]
  m = int(np.prod(outs))
  n, c = x.shape[:2]
  ctx.check_indices(1, idx, n * c * m, f"flat (N, C, {', '.join(map(str, outs))})", negative=False)
  # indices are flat positions in (N, C, *default output shape); a larger output_shape pads after
  ar = Tensor.arange(n * c * m, device=x.device).cast(dtypes.int64).reshape(n, c, 1, m)
  hot = idx.reshape(n, c, -1, 1).cast(dtypes.int64).eq(ar)
  y = hot.where(x.reshape(n, c, -1, 1), 0).sum(2).cast(x.dtype).reshape(n, c, *outs)
  if out_shape is not None:
    want = _ints(out_shape)[2:]
    y = y.pad(((0, 0), (0, 0)) + tuple((0, max(w - o, 0)) for w, o in zip(want, outs)))
  return y


# ***** normalization *****
@op("BatchNormalization")
def batch_norm(ctx: Any, inp: list, attrs: dict) -> Any:
  x, scale, b, mean, var = inp[:5]
  eps = attrs.get("epsilon", 1e-5)
  shp = (1, -1) + (1,) * (x.ndim - 2)
  training = attrs.get("training_mode", 0) and ctx.opset >= 14
  if not training:
    y = (x - mean.reshape(shp)) / (var.reshape(shp) + eps).sqrt() * scale.reshape(shp) + b.reshape(shp)
    return y.cast(x.dtype)
  axes = (0,) + tuple(range(2, x.ndim))
  bm = x.mean(axes)
  bv = ((x - bm.reshape(shp)) ** 2).mean(axes)
  y = (x - bm.reshape(shp)) / (bv.reshape(shp) + eps).sqrt() * scale.reshape(shp) + b.reshape(shp)
  mom = attrs.get("momentum", 0.9)
  return y, mean * mom + bm * (1 - mom), var * mom + bv * (1 - mom)


@op("InstanceNormalization")
def instance_norm(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, scale, b = inp
  axes = tuple(range(2, x.ndim))
  shp = (1, -1) + (1,) * (x.ndim - 2)
  m = x.mean(axes, keepdim=True)
  v = ((x - m) ** 2).mean(axes, keepdim=True)
  return (x - m) / (v + attrs.get("epsilon", 1e-5)).sqrt() * scale.reshape(shp) + b.reshape(shp)


@op("LayerNormalization")
def layer_norm(ctx: Any, inp: list, attrs: dict) -> tuple:
  x, scale, b = inp[0], inp[1], _opt(inp, 2)
  ax = _axis(attrs.get("axis", -1), x.ndim)
  axes = tuple(range(ax, x.ndim))
  xf = x.cast(dtypes.float32) if attrs.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
  m = xf.mean(axes, keepdim=True)
  v = ((xf - m) ** 2).mean(axes, keepdim=True)
  inv = (v + attrs.get("epsilon", 1e-5)).rsqrt()
  y = ((xf - m) * inv).cast(x.dtype) * scale
  if b is not None: y = y + b
  # stored, not left inline: a transformer's normalized rows (64x128 = 8192 elements) are under the scheduler's
  # window-size cut (WINDOW_MIN_SIZE), so the next MatMul/Gemm would recompute (x-m)*rsqrt(v+eps)*scale+b, its
  # division and square root included, once per column tile of its output (tiny GPT-2's QKV projection: 260 us
  # against 45 us stored); one small elementwise kernel is cheaper
  return y.cast(x.dtype).contiguous(), m, inv


@op("RMSNormalization")
def rms_norm(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, scale = inp
  ax = _axis(attrs.get("axis", -1), x.ndim)
  xf = x.cast(dtypes.float32) if attrs.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
  r = ((xf * xf).mean(tuple(range(ax, x.ndim)), keepdim=True) + attrs.get("epsilon", 1e-5)).rsqrt()
  return ((xf * r).cast(x.dtype) * scale).cast(x.dtype)


@op("GroupNormalization")
def group_norm(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, scale, b = inp
  g = attrs["num_groups"]
  n, c = x.shape[:2]
  xf = x.cast(dtypes.float32) if attrs.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
  xg = xf.reshape(n, g, -1)
  m = xg.mean(2, keepdim=True)
  v = ((xg - m) ** 2).mean(2, keepdim=True)
  y = ((xg - m) / (v + attrs.get("epsilon", 1e-5)).sqrt()).reshape(x.shape).cast(x.dtype)
  shp = (1, -1) + (1,) * (x.ndim - 2)
  if scale.shape[0] != c:  # opset 18: one scale and bias per group
    scale, b = scale.reshape(g, 1).expand(g, c // g).reshape(c), b.reshape(g, 1).expand(g, c // g).reshape(c)
  return y * scale.reshape(shp) + b.reshape(shp)


@op("LpNormalization")
def lp_norm(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  ax, p = _axis(attrs.get("axis", -1), x.ndim), attrs.get("p", 2)
  n = x.abs().sum(ax, keepdim=True) if p == 1 else (x * x).sum(ax, keepdim=True).sqrt()
  return n.eq(0).where(0, x / n.eq(0).where(1, n)).cast(x.dtype)  # a zero vector stays zero


@op("MeanVarianceNormalization")
def mvn(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  axes = tuple(_axis(a, x.ndim) for a in attrs.get("axes", [0, 2, 3]))
  m = x.mean(axes, keepdim=True)
  v = ((x - m) ** 2).mean(axes, keepdim=True)
  return (x - m) / (v.sqrt() + 1e-9)


@op("LRN")
def lrn(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  size = attrs["size"]
  alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
  lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
  sq = (x * x).pad(((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
  c = x.shape[1]
  s = sum(sq.shrink(tuple((j, j + c) if i == 1 else None for i in range(x.ndim))) for j in range(size))
  return x / (bias + alpha / size * s) ** beta


# ***** dropout *****
@op("Dropout")
def dropout(ctx: Any, inp: list, attrs: dict) -> Any:
  x = inp[0]
  ratio = attrs.get("ratio", 0.5) if ctx.opset < 12 else (float(_item(inp[1])) if _opt(inp, 1) is not None else 0.5)
  training = bool(_item(_opt(inp, 2))) if _opt(inp, 2) is not None else False
  if not training or ratio == 0:
    mask = Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device) if x.shape else Tensor(True, device=x.device)
    return x, mask
  if "seed" in attrs: Tensor.manual_seed(attrs["seed"])
  keep = Tensor.rand(*x.shape, device=x.device) >= ratio
  return keep.where(x / (1 - ratio), 0).cast(x.dtype), keep


# ***** resampling *****
def _cubic(t: np.ndarray, a: float) -> np.ndarray:
  t = np.abs(t)
  return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                  np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _resize_matrix(n_in: int, n_out: int, scale: float, attrs: dict, roi: tuple[float, float] | None) -> tuple:
  """(weights (n_out, n_in), mask of outputs that take the extrapolation value) for one axis."""
  ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
  mode = attrs.get("mode", "nearest")
  x = np.arange(n_out, dtype=np.float64)
  if ctm == "half_pixel": xo = (x + 0.5) / scale - 0.5
  elif ctm == "half_pixel_symmetric":
    adj = n_out / (scale * n_in)
    xo = n_in / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
  elif ctm == "pytorch_half_pixel": xo = (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
  elif ctm == "align_corners":  # the resized length is in * scale, unrounded
    xo = x * (n_in - 1) / (n_in * scale - 1) if n_in * scale > 1 else np.zeros_like(x)
  elif ctm == "asymmetric": xo = x / scale
  elif ctm == "tf_crop_and_resize":
    s, e = roi if roi is not None else (0.0, 1.0)
    if n_out > 1: xo = s * (n_in - 1) + x * (e - s) * (n_in - 1) / (n_out - 1)
    else: xo = np.full_like(x, 0.5 * (s + e) * (n_in - 1))
  else: raise OnnxError(f"Resize coordinate_transformation_mode={ctm!r} is not supported")
  extrap = (xo < 0) | (xo > n_in - 1) if ctm == "tf_crop_and_resize" else np.zeros(n_out, bool)
  w = np.zeros((n_out, n_in))
  rows = np.arange(n_out)
  if mode == "nearest":
    nm = attrs.get("nearest_mode", "round_prefer_floor")
    if nm == "round_prefer_floor": idx = np.where(xo - np.floor(xo) == 0.5, np.floor(xo), np.round(xo))
    elif nm == "round_prefer_ceil": idx = np.floor(xo + 0.5)
    elif nm == "floor": idx = np.floor(xo)
    elif nm == "ceil": idx = np.ceil(xo)
    else: raise OnnxError(f"Resize nearest_mode={nm!r} is not supported")
    w[rows, np.clip(idx, 0, n_in - 1).astype(int)] = 1
    return w, extrap
  antialias = attrs.get("antialias", 0) and scale < 1
  if mode == "linear":
    if antialias:
      sup = 1 / scale
      for r in rows:
        js = np.arange(int(np.floor(xo[r] - sup)), int(np.ceil(xo[r] + sup)) + 1)
        ws = np.maximum(0, 1 - np.abs((js - xo[r]) * scale))
        ok = (js >= 0) & (js < n_in)
        ws = ws * ok
        w[r, js[ok]] += ws[ok] / ws.sum()
      return w, extrap
    xc = np.clip(xo, 0, n_in - 1)
    x0 = np.floor(xc).astype(int)
    x1 = np.minimum(x0 + 1, n_in - 1)
    f = xc - x0
    np.add.at(w, (rows, x0), 1 - f)
    np.add.at(w, (rows, x1), f)
    return w, extrap
  if mode == "cubic":
    a, excl = attrs.get("cubic_coeff_a", -0.75), attrs.get("exclude_outside", 0)
    if antialias:
      sup = 2 / scale
      for r in rows:
        js = np.arange(int(np.floor(xo[r] - sup)), int(np.ceil(xo[r] + sup)) + 1)
        ws = _cubic((js - xo[r]) * scale, a)
        ok = (js >= 0) & (js < n_in)
        if excl: ws = ws * ok
        ws = ws / ws.sum()
        np.add.at(w[r], np.clip(js, 0, n_in - 1), ws)
      return w, extrap
    x0 = np.floor(xo).astype(int)
    for off in (-1, 0, 1, 2):
      j = x0 + off
      ws = _cubic(xo - j, a)
      if excl: ws = np.where((j >= 0) & (j < n_in), ws, 0)
      np.add.at(w, (rows, np.clip(j, 0, n_in - 1)), ws)
    if excl: w = w / w.sum(1, keepdims=True)
    return w, extrap
  raise OnnxError(f"Resize mode={mode!r} is not supported; valid: nearest, linear, cubic")


def _resize(x: Tensor, scales: list[float] | None, sizes: list[int] | None, attrs: dict, roi: list | None,
            axes: list[int] | None) -> Tensor:
  nd = x.ndim
  shape = tuple(d for d in x.shape if isinstance(d, int))  # the resize matrices are built on the host
  if len(shape) != nd: raise OnnxError(f"Resize needs an input of concrete shape, got {x.shape}")
  axes = [_axis(a, nd) for a in axes] if axes else list(range(nd))
  if sizes:
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    sc = [sizes[i] / shape[a] for i, a in enumerate(axes)]
    if policy != "stretch":
      s = min(sc) if policy == "not_larger" else max(sc)
      sc = [s] * len(axes)
      sizes = [int(math.floor(shape[a] * s + 0.5)) for a in axes]
    outs = list(sizes)
  elif scales:
    sc = list(scales)
    outs = [int(math.floor(shape[a] * s)) for a, s in zip(axes, sc)]
  else: raise OnnxError("Resize needs scales or sizes (one of them non-empty); got neither")
  y = x.cast(dtypes.float32) if not _is_float(x) else x
  rk = len(roi) // 2 if roi else 0
  for i, a in enumerate(axes):
    if outs[i] == shape[a] and sc[i] == 1 and attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize":
      continue
    r = (roi[i], roi[i + rk]) if roi else None
    w, ext = _resize_matrix(shape[a], outs[i], sc[i], attrs, r)
    wt = Tensor(w.astype(np.float32), device=x.device)
    yt = y.transpose(a, -1)
    y = (yt.unsqueeze(-2) * wt).sum(-1) if shape[a] < 64 else yt @ wt.T
    if ext.any():
      y = Tensor(ext, device=x.device).where(attrs.get("extrapolation_value", 0.0), y)
    y = y.transpose(a, -1)
  if not _is_float(x): y = y.round().clip(x.dtype.min, x.dtype.max)
  return y.cast(x.dtype)


@op("Resize")
def resize(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  if ctx.opset < 11: return _resize(x, [float(v) for v in _np(inp[1]).reshape(-1)], None,
                                    {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor", **attrs},
                                    None, None)
  roi, scales, sizes = _opt(inp, 1), _opt(inp, 2), _opt(inp, 3)
  roi_l = [float(v) for v in _np(roi).reshape(-1)] if roi is not None and roi.numel() else None
  sc = [float(v) for v in _np(scales).reshape(-1)] if scales is not None and scales.numel() else None
  sz = _ints(sizes) if sizes is not None and sizes.numel() else None
  axes = attrs.get("axes")
  if roi_l and axes and len(roi_l) == 2 * x.ndim: roi_l = None
  return _resize(x, sc, sz, attrs, roi_l, axes)


@op("Upsample")
def upsample(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  scales = attrs["scales"] if ctx.opset < 9 else [float(v) for v in _np(inp[1]).reshape(-1)]
  mode = attrs.get("mode", "nearest")
  return _resize(x, scales, None, {"mode": mode, "coordinate_transformation_mode": "asymmetric",
                                   "nearest_mode": "floor"}, None, None)


# ***** attention *****
@op("Attention")
def attention(ctx: Any, inp: list, attrs: dict) -> tuple:
  q, k, v = inp[:3]
  mask, past_k, past_v, nonpad = _opt(inp, 3), _opt(inp, 4), _opt(inp, 5), _opt(inp, 6)
  three_d = q.ndim == 3
  if three_d:
    qh, kvh = attrs["q_num_heads"], attrs["kv_num_heads"]
    b = q.shape[0]
    q = q.reshape(b, q.shape[1], qh, -1).permute(0, 2, 1, 3)
    k = k.reshape(b, k.shape[1], kvh, -1).permute(0, 2, 1, 3)
    v = v.reshape(b, v.shape[1], kvh, -1).permute(0, 2, 1, 3)
  scale = attrs.get("scale", 1 / math.sqrt(q.shape[3]))
  sq = float(np.float32(math.sqrt(scale))) if q.dtype == dtypes.float32 else math.sqrt(scale)
  if past_k is not None: k, v = past_k.cat(k, dim=2), past_v.cat(v, dim=2)
  present_k, present_v = k, v
  lq, lk = q.shape[2], k.shape[2]
  ninf = float("-inf")
  bias = Tensor.zeros(lq, lk, dtype=q.dtype, device=q.device)
  if mask is not None and mask.shape[-1] < lk:
    mask = mask.pad(((0, 0),) * (mask.ndim - 1) + ((0, lk - mask.shape[-1]),), value=False if mask.dtype == dtypes.bool
                    else ninf)
  if mask is not None: bias = bias + (mask.where(0.0, ninf).cast(q.dtype) if mask.dtype == dtypes.bool else mask)
  ii = Tensor.arange(lq, device=q.device).reshape(lq, 1)
  jj = Tensor.arange(lk, device=q.device).reshape(1, lk)
  if nonpad is not None and past_k is None:
    off: Any = (nonpad.reshape(-1, 1, 1, 1) - lq).cast(dtypes.int32)
    ii, jj = ii.reshape(1, 1, lq, 1), jj.reshape(1, 1, 1, lk)
  else: off = past_k.shape[2] if past_k is not None else 0
  if attrs.get("is_causal", 0): bias = bias + (jj <= ii + off).where(0.0, ninf).cast(q.dtype)
  lw, rw = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
  if lw >= 0: bias = bias + ((ii + off) - jj <= lw).where(0.0, ninf).cast(q.dtype)
  if rw >= 0: bias = bias + (jj - (ii + off) <= rw).where(0.0, ninf).cast(q.dtype)
  if nonpad is not None:
    bias = bias + (Tensor.arange(lk, device=q.device).reshape(1, lk) < nonpad.reshape(-1, 1)).where(0.0, ninf) \
      .cast(q.dtype).reshape(-1, 1, 1, lk)
  hq, hk = q.shape[1], k.shape[1]
  if hq != hk: k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
  qk = (q * sq) @ (k.transpose(-1, -2) * sq)
  softcap = attrs.get("softcap", 0.0)
  if softcap > 0: qk = (qk / softcap).tanh() * softcap
  mode = attrs.get("qk_matmul_output_mode", 0)
  qkb = qk + bias
  out_qk = qkb if mode == 2 else qk
  sm_in = qkb.cast(_DTYPES[attrs["softmax_precision"]]) if "softmax_precision" in attrs else qkb
  mx = sm_in.max(-1, keepdim=True)
  mx = mx.eq(ninf).where(0, mx)
  e = (sm_in - mx).exp()
  s = e.sum(-1, keepdim=True)
  p = e / s.eq(0).where(1, s)
  masked = bias.max(-1, keepdim=True).eq(ninf)
  p = masked.where(0, p).cast(q.dtype)
  if mode == 3: out_qk = p
  y = p @ v
  if three_d: y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
  return y, present_k, present_v, out_qk.cast(q.dtype)


@op("RotaryEmbedding")
def rotary_embedding(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, cos, sin, pos = inp[0], inp[1], inp[2], _opt(inp, 3)
  orig = x.shape
  if x.ndim == 3:  # (B, S, hidden) -> (B, S, H, D)
    nh = attrs["num_heads"]
    x = x.reshape(x.shape[0], x.shape[1], nh, -1)
  else: x = x.permute(0, 2, 1, 3)                      # (B, H, S, D) -> (B, S, H, D)
  if pos is not None: cos, sin = cos[pos.cast(dtypes.int32)], sin[pos.cast(dtypes.int32)]
  d = x.shape[-1]
  rd = attrs.get("rotary_embedding_dim", 0) or d
  xr, rest = x.shrink((None, None, None, (0, rd))), x.shrink((None, None, None, (rd, d)))
  cos, sin = cos.shrink((None, None, (0, rd // 2))).unsqueeze(2), sin.shrink((None, None, (0, rd // 2))).unsqueeze(2)
  if attrs.get("interleaved", 0):
    x1, x2 = xr.reshape(*xr.shape[:-1], rd // 2, 2).shrink((None,) * 4 + ((0, 1),)).squeeze(-1), \
      xr.reshape(*xr.shape[:-1], rd // 2, 2).shrink((None,) * 4 + ((1, 2),)).squeeze(-1)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = o1.unsqueeze(-1).cat(o2.unsqueeze(-1), dim=-1).reshape(*xr.shape)
  else:
    x1, x2 = xr.shrink((None, None, None, (0, rd // 2))), xr.shrink((None, None, None, (rd // 2, rd)))
    out = (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)
  y = out.cat(rest, dim=-1) if rd < d else out
  return y.reshape(orig) if len(orig) == 3 else y.permute(0, 2, 1, 3)


# ***** losses *****
def _nll(logp: Tensor, target: Tensor, weight: Tensor | None, attrs: dict) -> Tensor:
  c = logp.shape[1]
  ign = attrs.get("ignore_index")
  t = target.cast(dtypes.int64)
  valid = t.ne(ign) if ign is not None else None
  safe = valid.where(t, 0) if valid is not None else t
  hot = safe.unsqueeze(1).eq(Tensor.arange(c, device=logp.device).cast(dtypes.int64)
                             .reshape(1, c, *[1] * (t.ndim - 1)))
  picked = hot.where(logp, 0).sum(1)
  w = (weight[safe.cast(dtypes.int32)] if weight is not None else Tensor.ones(*t.shape, device=logp.device)
       .cast(logp.dtype))
  if valid is not None: w = valid.where(w, 0)
  loss = -picked * w
  red = attrs.get("reduction", "mean")
  if red == "none": return loss
  if red == "sum": return loss.sum()
  return loss.sum() / w.sum()


@op("NegativeLogLikelihoodLoss")
def nll_loss(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return _nll(inp[0], inp[1], _opt(inp, 2), attrs).cast(inp[0].dtype)


@op("SoftmaxCrossEntropyLoss")
def sce_loss(ctx: Any, inp: list, attrs: dict) -> tuple:
  x = inp[0]
  logp = x.log_softmax(1)
  return _nll(logp, inp[1], _opt(inp, 2), attrs).cast(x.dtype), logp


# ***** quantization *****
def _per_axis(s: Tensor, x: Tensor, axis: int, block: int) -> Tensor:
  """A scale / zero point broadcast against x: scalar, per-axis (1-D) or blocked along `axis`."""
  if s.ndim == 0 or s.numel() == 1 and s.ndim <= 1: return s.reshape(())
  ax = _axis(axis, x.ndim)
  if s.ndim == 1 and not block: return s.reshape([-1 if i == ax else 1 for i in range(x.ndim)])
  return s.repeat_interleave(block, dim=ax).shrink(tuple((0, n) for n in x.shape))


@op("DequantizeLinear")
def dequantize_linear(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, s, zp = inp[0], inp[1], _opt(inp, 2)
  ax, blk = attrs.get("axis", 1), attrs.get("block_size", 0)
  xf = x.cast(dtypes.float32)
  if zp is not None: xf = xf - _per_axis(zp, x, ax, blk).cast(dtypes.float32)
  out_dt = _DTYPES[attrs["output_dtype"]] if attrs.get("output_dtype") else s.dtype
  return (xf * _per_axis(s, x, ax, blk).cast(dtypes.float32)).cast(out_dt)


def _quant_target(ctx: Any, zp: Any, attrs: dict) -> int:
  from tiny_tensor.nn.onnx.ops import _elem_type
  if attrs.get("output_dtype"): return attrs["output_dtype"]
  if zp is not None: return _elem_type(ctx, 2) or 2
  return 2


@op("QuantizeLinear")
def quantize_linear(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, s, zp = inp[0], inp[1], _opt(inp, 2)
  ax, blk = attrs.get("axis", 1), attrs.get("block_size", 0)
  et = _quant_target(ctx, zp, attrs)
  y = x.cast(dtypes.float32) / _per_axis(s, x, ax, blk).cast(dtypes.float32)
  if et in (17, 18, 19, 20, 23):
    if zp is not None: y = y + _per_axis(zp, x, ax, blk).cast(dtypes.float32)
    return cast_to(y, et, attrs.get("saturate", 1), ctx.device)
  y = _round_even(y)
  if zp is not None: y = y + _per_axis(zp, x, ax, blk).cast(dtypes.float32)
  lo, hi = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 21: (0, 15), 22: (-8, 7),
            25: (0, 3), 26: (-2, 1)}[et]
  return y.clip(lo, hi).cast(_DTYPES[et])


def _round_even(y: Tensor) -> Tensor:
  f = (y + 0.5).floor()
  tie = (f - y).eq(0.5) & (f % 2).ne(0)
  return tie.where(f - 1, f)


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: Any, inp: list, attrs: dict) -> tuple:
  x = inp[0]
  mx, mn = x.max().maximum(0), x.min().minimum(0)
  scale = (mx - mn) / 255
  zp = _round_even(-mn / scale).clip(0, 255)
  y = (_round_even(x / scale) + zp).clip(0, 255).cast(dtypes.uint8)
  return y, scale.cast(dtypes.float32), zp.cast(dtypes.uint8)


def _deq(x: Tensor, s: Tensor, zp: Tensor | None, axis: int = 1) -> Tensor:
  xf = x.cast(dtypes.float32)
  if zp is not None: xf = xf - (zp.cast(dtypes.float32) if zp.ndim == 0 or zp.numel() == 1 else
                                _per_axis(zp, x, axis, 0).cast(dtypes.float32))
  return xf * (s if s.ndim == 0 or s.numel() == 1 else _per_axis(s, x, axis, 0)).cast(dtypes.float32).reshape(
    () if s.numel() == 1 else _per_axis(s, x, axis, 0).shape)


@op("QLinearMatMul")
def qlinear_matmul(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, sa, za, b, sb, zb, sy, zy = inp
  af = (a.cast(dtypes.float32) - za.cast(dtypes.float32).reshape(-1, 1) if za.numel() > 1 else
        a.cast(dtypes.float32) - za.cast(dtypes.float32).reshape(()))
  bf = b.cast(dtypes.float32) - (zb.cast(dtypes.float32).reshape(1, -1) if zb.numel() > 1 else
                                 zb.cast(dtypes.float32).reshape(()))
  acc = af @ bf
  ssa = sa.cast(dtypes.float32).reshape(-1, 1) if sa.numel() > 1 else sa.cast(dtypes.float32).reshape(())
  ssb = sb.cast(dtypes.float32).reshape(1, -1) if sb.numel() > 1 else sb.cast(dtypes.float32).reshape(())
  y = _round_even(acc * ssa * ssb / sy.cast(dtypes.float32).reshape(())) + zy.cast(dtypes.float32).reshape(())
  lo, hi = (0, 255) if zy.dtype == dtypes.uint8 else (-128, 127)
  return y.clip(lo, hi).cast(zy.dtype)


@op("MatMulInteger")
def matmul_integer(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b, za, zb = inp[0], inp[1], _opt(inp, 2), _opt(inp, 3)
  def zp(z: Tensor, shape: tuple) -> Tensor:  # per-row (a) / per-column (b) zero points, or one for all
    return z.cast(dtypes.int32).reshape(shape if z.numel() > 1 else ())
  ai, bi = a.cast(dtypes.int32), b.cast(dtypes.int32)
  if za is not None: ai = ai - zp(za, (-1, 1))
  if zb is not None: bi = bi - zp(zb, (1, -1))
  return ai.matmul(bi)


@op("ConvInteger")
def conv_integer(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, w, zx, zw = inp[0], inp[1], _opt(inp, 2), _opt(inp, 3)
  xi = x.cast(dtypes.int32) - (zx.cast(dtypes.int32).reshape(()) if zx is not None else 0)
  wi = w.cast(dtypes.int32)
  if zw is not None: wi = wi - zw.cast(dtypes.int32).reshape((-1, *[1] * (w.ndim - 1)) if zw.numel() > 1 else ())
  return conv(ctx, [xi, wi], attrs).cast(dtypes.int32)


@op("QLinearConv")
def qlinear_conv(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, sx, zx, w, sw, zw, sy, zy = inp[:8]
  b = _opt(inp, 8)
  xf = (x.cast(dtypes.float32) - zx.cast(dtypes.float32).reshape(())) * sx.cast(dtypes.float32).reshape(())
  shp = (-1,) + (1,) * (w.ndim - 1)
  wf = (w.cast(dtypes.float32) - (zw.cast(dtypes.float32).reshape(shp) if zw.numel() > 1 else
                                  zw.cast(dtypes.float32).reshape(())))
  wf = wf * (sw.cast(dtypes.float32).reshape(shp) if sw.numel() > 1 else sw.cast(dtypes.float32).reshape(()))
  bf = None
  if b is not None:
    bf = b.cast(dtypes.float32) * sx.cast(dtypes.float32).reshape(()) * sw.cast(dtypes.float32).reshape(-1)
  y = conv(ctx, [xf, wf, bf], attrs)
  y = _round_even(y / sy.cast(dtypes.float32).reshape(())) + zy.cast(dtypes.float32).reshape(())
  lo, hi = (0, 255) if zy.dtype == dtypes.uint8 else (-128, 127)
  return y.clip(lo, hi).cast(zy.dtype)


# ***** windows *****
def _window(coefs: list[float]) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    n = int(_item(inp[0]))
    periodic = attrs.get("periodic", 1)
    nn = n if periodic else n - 1
    k = Tensor.arange(n, device=ctx.device).cast(dtypes.float64)
    w = sum(((-1) ** i) * c * (2 * math.pi * i * k / nn).cos() for i, c in enumerate(coefs))
    return w.cast(_DTYPES[attrs.get("output_datatype", 1)])
  return run


OPS_WINDOWS = {"HannWindow": [0.5, 0.5], "HammingWindow": [25 / 46, 21 / 46], "BlackmanWindow": [0.42, 0.5, 0.08]}
for _n, _c in OPS_WINDOWS.items(): op(_n)(_window(_c))


# make `to_numpy` referenced (shared helpers use it through ops)
_ = to_numpy
