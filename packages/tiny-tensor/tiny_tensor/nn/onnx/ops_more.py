"""ONNX sequences, optionals, control flow (If, Loop, Scan, SequenceMap), string operators and a few others."""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from tiny_uop.dtype import dtypes, to_numpy
from tiny_tensor.nn.onnx.base import OnnxError, OnnxModelError, to_tensor
from tiny_tensor.nn.onnx.ops import _axis, _ints, _item, _np, _opt, op
from tiny_tensor.tensor import Tensor


# ***** sequences (Python lists of Tensors) *****
@op("SequenceConstruct")
def seq_construct(ctx: Any, inp: list, attrs: dict) -> list: return list(inp)


@op("SequenceEmpty")
def seq_empty(ctx: Any, inp: list, attrs: dict) -> list: return []


@op("SequenceAt")
def seq_at(ctx: Any, inp: list, attrs: dict) -> Tensor: return inp[0][int(_item(inp[1]))]


@op("SequenceLength")
def seq_length(ctx: Any, inp: list, attrs: dict) -> Tensor: return Tensor(np.array(len(inp[0]), np.int64),
                                                                          device=ctx.device)


@op("SequenceInsert")
def seq_insert(ctx: Any, inp: list, attrs: dict) -> list:
  s = list(inp[0])
  pos = int(_item(inp[2])) if _opt(inp, 2) is not None else len(s)
  s.insert(pos if pos >= 0 else pos + len(s), inp[1])
  return s


@op("SequenceErase")
def seq_erase(ctx: Any, inp: list, attrs: dict) -> list:
  s = list(inp[0])
  pos = int(_item(inp[1])) if _opt(inp, 1) is not None else -1
  del s[pos]
  return s


@op("ConcatFromSequence")
def concat_from_seq(ctx: Any, inp: list, attrs: dict) -> Tensor:
  s = inp[0]
  if attrs.get("new_axis", 0):
    ax = _axis(attrs["axis"], s[0].ndim + 1)
    return s[0].stack(*s[1:], dim=ax)
  ax = _axis(attrs["axis"], s[0].ndim)
  return s[0].cat(*s[1:], dim=ax)


@op("SplitToSequence")
def split_to_seq(ctx: Any, inp: list, attrs: dict) -> list:
  x, sp = inp[0], _opt(inp, 1)
  ax = _axis(attrs.get("axis", 0), x.ndim)
  if sp is None:
    parts = list(x.split(1, ax))
    return [p.squeeze(ax) for p in parts] if not attrs.get("keepdims", 1) else parts
  sizes = _ints(sp)
  if sp.ndim == 0: return list(x.split(sizes[0], ax))
  return list(x.split(sizes, ax))


@op("SequenceMap")
def seq_map(ctx: Any, inp: list, attrs: dict) -> tuple:
  g = attrs["body"]
  n = len(inp[0])
  outs: list[list] = [[] for _ in g.output]
  for i in range(n):
    args = [a[i] if isinstance(a, list) else a for a in inp]
    for j, r in enumerate(ctx.run_graph(g, args)): outs[j].append(r)
  return tuple(outs)


# ***** optionals (None is the empty optional) *****
@op("Optional")
def optional(ctx: Any, inp: list, attrs: dict) -> Any: return _opt(inp, 0)


@op("OptionalHasElement")
def optional_has(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return Tensor(_opt(inp, 0) is not None, device=ctx.device)


@op("OptionalGetElement")
def optional_get(ctx: Any, inp: list, attrs: dict) -> Any:
  if inp[0] is None: raise OnnxError("OptionalGetElement of an empty optional")
  return inp[0]


# ***** control flow *****
@op("If")
def if_(ctx: Any, inp: list, attrs: dict) -> tuple:
  g = attrs["then_branch"] if bool(_np(inp[0]).reshape(-1)[0]) else attrs["else_branch"]
  return tuple(ctx.run_graph(g, []))


@op("Loop")
def loop(ctx: Any, inp: list, attrs: dict) -> tuple:
  g = attrs["body"]
  m, cond = _opt(inp, 0), _opt(inp, 1)
  trip = int(_item(m)) if m is not None else None
  go = bool(_item(cond)) if cond is not None else True
  carried = list(inp[2:])
  n_carried = len(carried)
  scans: list[list] = [[] for _ in range(len(g.output) - 1 - n_carried)]
  i, limit = 0, ctx.runner.max_loop_trips
  while go and (trip is None or i < trip):
    if i >= limit:
      raise OnnxModelError(f"node {ctx.node.name!r} (Loop) would run more than {limit} iterations (trip count "
                           f"{'unbounded' if trip is None else trip}, condition still true); if that is meant, raise "
                           "the limit: OnnxRunner(..., max_loop_trips=N)")
    out = ctx.run_graph(g, [Tensor(np.array(i, np.int64), device=ctx.device),
                            Tensor(np.array(go), device=ctx.device), *carried])
    go = bool(_np(out[0]).reshape(-1)[0]) if isinstance(out[0], Tensor) else True
    carried = list(out[1:1 + n_carried])
    for j, s in enumerate(out[1 + n_carried:]): scans[j].append(s)
    i += 1
  stacked = [s[0].stack(*s[1:]) if s else Tensor(np.zeros((0,), np.float32), device=ctx.device) for s in scans]
  return tuple(carried + stacked)


@op("Scan")
def scan(ctx: Any, inp: list, attrs: dict) -> tuple:
  g = attrs["body"]
  n_scan = attrs["num_scan_inputs"]
  state = list(inp[:len(inp) - n_scan])
  xs = inp[len(inp) - n_scan:]
  in_axes = attrs.get("scan_input_axes", [0] * n_scan)
  in_dirs = attrs.get("scan_input_directions", [0] * n_scan)
  n_out_scan = len(g.output) - len(state)
  out_axes = attrs.get("scan_output_axes", [0] * n_out_scan)
  out_dirs = attrs.get("scan_output_directions", [0] * n_out_scan)
  xs = [x.permute(_axis(a, x.ndim), *[i for i in range(x.ndim) if i != _axis(a, x.ndim)]) for x, a in zip(xs, in_axes)]
  n = xs[0].shape[0]
  outs: list[list] = [[] for _ in range(n_out_scan)]
  for t in range(n):
    args = [x[n - 1 - t if d else t] for x, d in zip(xs, in_dirs)]
    r = ctx.run_graph(g, state + args)
    state = list(r[:len(state)])
    for j, y in enumerate(r[len(state):]): outs[j].append(y)
  res = []
  for j, ys in enumerate(outs):
    if out_dirs[j]: ys = ys[::-1]
    st = ys[0].stack(*ys[1:])
    ax = _axis(out_axes[j], st.ndim)
    if ax: st = st.permute(*range(1, ax + 1), 0, *range(ax + 1, st.ndim))
    res.append(st)
  return tuple(state + res)


# ***** strings (numpy object arrays on the host) *****
def _strs(x: Any) -> np.ndarray: return x if isinstance(x, np.ndarray) else np.asarray(x.numpy(), dtype=object)


@op("StringConcat")
def string_concat(ctx: Any, inp: list, attrs: dict) -> np.ndarray:
  a, b = np.broadcast_arrays(_strs(inp[0]), _strs(inp[1]))
  return np.array([x + y for x, y in zip(a.reshape(-1), b.reshape(-1))], dtype=object).reshape(a.shape)


@op("RegexFullMatch")
def regex_full_match(ctx: Any, inp: list, attrs: dict) -> Tensor:
  pat = re.compile(attrs["pattern"])
  x = _strs(inp[0])
  return Tensor(np.array([bool(pat.fullmatch(s)) for s in x.reshape(-1)], bool).reshape(x.shape), device=ctx.device)


@op("StringNormalizer")
def string_normalizer(ctx: Any, inp: list, attrs: dict) -> np.ndarray:
  x = _strs(inp[0])
  stop = set(attrs.get("stopwords", []))
  cs = attrs.get("is_case_sensitive", 0)
  keep = [s for s in x.reshape(-1) if (s if cs else s.lower()) not in (stop if cs else {w.lower() for w in stop})]
  act = attrs.get("case_change_action", "NONE")
  keep = [s.lower() if act == "LOWER" else s.upper() if act == "UPPER" else s for s in keep]
  if not keep: keep = [""]
  return np.array(keep, dtype=object).reshape((1, -1) if x.ndim == 2 else (-1,))


@op("StringSplit")
def string_split(ctx: Any, inp: list, attrs: dict) -> tuple:
  x = _strs(inp[0])
  sep, maxsplit = attrs.get("delimiter") or None, attrs.get("maxsplit", -1)
  parts = [s.split(sep, maxsplit) if sep else s.split(None, maxsplit) for s in x.reshape(-1)]
  width = max((len(p) for p in parts), default=0)
  out = np.array([p + [""] * (width - len(p)) for p in parts], dtype=object).reshape(*x.shape, width)
  return out, Tensor(np.array([len(p) for p in parts], np.int64).reshape(x.shape), device=ctx.device)


# ***** others *****
@op("CenterCropPad")
def center_crop_pad(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, shp = inp[0], _ints(inp[1])
  axes = [_axis(a, x.ndim) for a in attrs.get("axes", list(range(x.ndim)))]
  for a, want in zip(axes, shp):
    n = x.shape[a]
    if want < n:
      s = (n - want) // 2
      x = x.shrink(tuple((s, s + want) if i == a else None for i in range(x.ndim)))
    elif want > n:
      b = (want - n) // 2
      x = x.pad(tuple((b, want - n - b) if i == a else (0, 0) for i in range(x.ndim)))
  return x


@op("NonMaxSuppression")
def non_max_suppression(ctx: Any, inp: list, attrs: dict) -> Tensor:
  boxes, scores = _np(inp[0]), _np(inp[1])
  mx = int(_item(inp[2])) if _opt(inp, 2) is not None else 0
  iou_t = float(_item(inp[3])) if _opt(inp, 3) is not None else 0.0
  sc_t = float(_item(inp[4])) if _opt(inp, 4) is not None else -np.inf
  center = attrs.get("center_point_box", 0)
  out = []
  for b in range(scores.shape[0]):
    bx = boxes[b]
    if center:
      bx = np.stack([bx[:, 1] - bx[:, 3] / 2, bx[:, 0] - bx[:, 2] / 2, bx[:, 1] + bx[:, 3] / 2,
                     bx[:, 0] + bx[:, 2] / 2], 1)
    y1, x1 = np.minimum(bx[:, 0], bx[:, 2]), np.minimum(bx[:, 1], bx[:, 3])
    y2, x2 = np.maximum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 1], bx[:, 3])
    area = (y2 - y1) * (x2 - x1)
    for c in range(scores.shape[1]):
      s = scores[b, c]
      order = [i for i in np.argsort(-s, kind="stable") if s[i] > sc_t]
      sel: list[int] = []
      for i in order:
        if len(sel) >= mx: break
        ok = True
        for j in sel:
          ih = max(0.0, min(y2[i], y2[j]) - max(y1[i], y1[j]))
          iw = max(0.0, min(x2[i], x2[j]) - max(x1[i], x1[j]))
          inter = ih * iw
          union = area[i] + area[j] - inter
          if union > 0 and inter / union > iou_t: ok = False; break  # noqa: E702
        if ok: sel.append(i)
      out += [[b, c, i] for i in sel]
  return Tensor(np.array(out, np.int64).reshape(-1, 3), device=ctx.device)


@op("Bernoulli")
def bernoulli(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  if "seed" in attrs: Tensor.manual_seed(int(attrs["seed"]))
  dt = to_tensor(np.zeros(1, np.float32), ctx.device, attrs["dtype"]).dtype if "dtype" in attrs else x.dtype
  return (Tensor.rand(*x.shape, device=x.device) < x).cast(dt)


_ = (dtypes, to_numpy)
