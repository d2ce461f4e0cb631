"""Small programs run through both tiny_tensor and tinygrad 0.14 by `test_tinygrad_semantic_diff.py`.

Each program takes the library as a namespace `L` (Tensor, dtypes, nn, Context, Variable, TinyJit) and returns a
value that `normalize` turns into JSON: a Tensor becomes its shape, dtype name and values. This module imports
neither library, so the tinygrad side can run it in a subprocess (`python semdiff_programs.py`, with DEV=PYTHON)
and print every result as one JSON object.
"""
from __future__ import annotations

import json
import math
import sys
import types
from typing import Any, Callable


def load_library(name: str) -> types.SimpleNamespace:
  """The public names the programs use, from `tiny_tensor` or `tinygrad`."""
  if name == "tinygrad":
    import tinygrad as lib
    from tinygrad import nn
  elif name == "tiny":
    import tiny_tensor as lib
    from tiny_tensor import nn
  else: raise ValueError(f"unknown library {name!r}: valid are 'tiny' and 'tinygrad'")
  return types.SimpleNamespace(Tensor=lib.Tensor, dtypes=lib.dtypes, nn=nn, Context=lib.Context,
                               Variable=lib.Variable, TinyJit=lib.TinyJit)


def normalize(x: Any) -> Any:
  """A JSON-able form of a program's result: Tensors as {shape, dtype, value}, dtypes by name, floats as floats."""
  if hasattr(x, "uop") and hasattr(x, "tolist"):
    return {"tensor": [int(s) for s in x.shape], "dtype": x.dtype.name, "value": normalize(x.tolist())}
  if hasattr(x, "itemsize") and hasattr(x, "name"): return {"dtype": x.name}
  if isinstance(x, bool) or x is None or isinstance(x, str): return x
  if isinstance(x, int): return {"int": x}
  if isinstance(x, float): return {"float": x if math.isfinite(x) else repr(x)}
  if isinstance(x, (list, tuple)): return [normalize(y) for y in x]
  if isinstance(x, dict): return {str(k): normalize(v) for k, v in x.items()}
  return {"other": type(x).__name__}


def run_all(L: types.SimpleNamespace, names: list[str] | None = None) -> dict[str, dict]:
  """{name: {"ok": normalized result} or {"exc": exception type name}} for every program (or those in `names`)."""
  out: dict[str, dict] = {}
  for name, prog in PROGRAMS.items():
    if names is not None and name not in names: continue
    try: out[name] = {"ok": normalize(prog(L))}
    except Exception as e:  # noqa: BLE001  (the harness records which error each library raises: that is the result)
      out[name] = {"exc": type(e).__name__, "msg": str(e)[:200]}
  return out


def _seq(L, *shape, dtype=None):
  """arange(prod(shape)) reshaped, as float32 unless `dtype` is given (the same data in both libraries)."""
  n = math.prod(shape)
  t = L.Tensor([float(i) / 4 - 1.5 for i in range(n)], dtype=dtype or L.dtypes.float32)
  return t.reshape(*shape)


def _grad_of(L, f: Callable, *vals: list) -> list:
  xs = [L.Tensor(v, dtype=L.dtypes.float32) for v in vals]
  for x in xs: x.requires_grad = True
  f(*xs).sum().backward()
  return [x.grad for x in xs]


def _train_step(L, opt_fn) -> list:
  w = L.Tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=L.dtypes.float32)
  w.requires_grad = True
  opt = opt_fn(L, [w])
  with L.Context(TRAINING=1):
    for _ in range(3):
      opt.zero_grad()
      ((w * w * w).sum() + w.sum()).backward()
      opt.step()
  return w


def _linear(L):
  lin = L.nn.Linear(3, 2)
  lin.weight = L.Tensor([[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]])
  lin.bias = L.Tensor([0.01, -0.02])
  return lin


def _jit_values(L) -> list:
  @L.TinyJit
  def f(a, b): return (a * b + 1).sum(0).realize()
  return [f(L.Tensor([[float(i), 2.0], [3.0, 4.0]]), L.Tensor([[1.0, float(i)], [0.5, 0.25]])).tolist()
          for i in range(4)]


def _jit_var(L) -> list:
  @L.TinyJit
  def f(a): return (a * 2).sum().realize()
  base = L.Tensor([float(i) for i in range(8)]).realize()
  out = []
  for n in (3, 5, 7, 4):
    v = L.Variable("n", 1, 8).bind(n)
    out.append(f(base[:v].contiguous()).item())
  return out


def _bn_train(L, bn, steps: int) -> None:
  with L.Context(TRAINING=1):
    for i in range(steps): bn(_seq(L, 3, 2) * (i + 1)).realize()


def _batchnorm_train(L) -> list:
  bn = L.nn.BatchNorm(2)
  with L.Context(TRAINING=1): bn(_seq(L, 3, 2)).realize()
  return [bn.running_mean, bn.running_var, bn.num_batches_tracked]


def _context_debug(L):
  with L.Context(DEBUG=0): t = (L.Tensor([1.0]) + 1).realize()
  return t


def _backward_nonscalar(L):
  x = L.Tensor([1.0, 2.0])
  x.requires_grad = True
  (x * 2).backward()
  return x.grad


def _set(L, layer, **tensors):
  """`layer` with its weights replaced by the given nested lists (the same numbers in both libraries)."""
  for k, v in tensors.items(): setattr(layer, k, None if v is None else L.Tensor(v, dtype=L.dtypes.float32))
  return layer


def _embedding_grad(L) -> list:
  e = _set(L, L.nn.Embedding(4, 2), weight=[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
  e.weight.requires_grad = True
  (e(L.Tensor([[1, 1, 3]])) * L.Tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])).sum().backward()
  return e.weight.grad


def _safetensors_roundtrip(L) -> list:
  import os
  import tempfile
  fd, fn = tempfile.mkstemp(suffix=".safetensors")
  os.close(fd)
  try:
    L.nn.state.safe_save({"a": L.Tensor([[1.0, 2.0]]), "b": L.Tensor([3], dtype=L.dtypes.int16)}, fn)
    loaded = L.nn.state.safe_load(fn)
    return [sorted(loaded), loaded["a"].tolist(), loaded["b"].dtype, loaded["b"].tolist()]
  finally: os.unlink(fn)


def _optimizer_group(L) -> list:
  a, b = L.Tensor([1.0, 2.0]), L.Tensor([3.0])
  a.requires_grad = b.requires_grad = True
  opt = L.nn.optim.OptimizerGroup(L.nn.optim.SGD([a], lr=0.1), L.nn.optim.Adam([b], lr=0.1))
  with L.Context(TRAINING=1):
    for _ in range(2):
      opt.zero_grad()
      ((a * a).sum() + (b * b * b).sum()).backward()
      opt.step()
  return [a, b]


def _jit_kwargs_dict(L) -> list:
  @L.TinyJit
  def f(x, y=None): return {"s": (x + y).realize(), "p": (x * y).realize()}
  out = []
  for i in range(3):
    r = f(L.Tensor([1.0, float(i)]), y=L.Tensor([2.0, 3.0]))
    out.append([r["s"].tolist(), r["p"].tolist()])
  return out


def _jit_optimizer_step(L) -> list:
  w = L.Tensor([1.0, -2.0, 3.0])
  w.requires_grad = True
  opt = L.nn.optim.Adam([w], lr=0.1)

  @L.TinyJit
  def step(x):
    opt.zero_grad()
    loss = ((w * x).sum() ** 2)
    loss.backward()
    opt.step()
    return loss.realize()
  with L.Context(TRAINING=1):
    losses = [step(L.Tensor([1.0, 0.5, float(i) / 4])).item() for i in range(4)]
  return [losses, w]


def _jit_list_input(L) -> list:
  @L.TinyJit
  def f(xs): return (xs[0] * xs[1]).realize()
  return [f([L.Tensor([1.0, float(i)]), L.Tensor([2.0, 3.0])]).tolist() for i in range(4)]


def _jit_duplicate_input(L) -> list:
  f = L.TinyJit(lambda a, b: (a + b).realize())
  t = L.Tensor([1.0, 2.0]).realize()
  return [f(t, t).tolist() for _ in range(3)]


def _optim_unused_param(L) -> list:
  a, b = L.Tensor([1.0, 2.0]), L.Tensor([5.0])
  a.requires_grad = b.requires_grad = True
  opt = L.nn.optim.SGD([a, b], lr=0.1)
  with L.Context(TRAINING=1):
    (a * a).sum().backward()
    opt.step()
  return [a, b]


def _optim_lr_assign(L) -> list:
  w = L.Tensor([1.0, 2.0])
  w.requires_grad = True
  opt = L.nn.optim.SGD([w], lr=0.1)
  with L.Context(TRAINING=1):
    for lr in (0.1, 0.5):
      opt.lr.assign(L.Tensor([lr], dtype=opt.lr.dtype, device=opt.lr.device)).realize()
      opt.zero_grad()
      (w * w).sum().backward()
      opt.step()
  return w


def _setitem(L, key, value):
  t = _seq(L, 3, 4).contiguous().realize()
  t[key] = value
  return t


P: dict[str, Callable] = {}
# ***** creation *****
P["create_list_int"] = lambda L: L.Tensor([1, 2, 3])
P["create_list_float"] = lambda L: L.Tensor([1.5, -2.0])
P["create_list_bool"] = lambda L: L.Tensor([True, False])
P["create_mixed_int_float"] = lambda L: L.Tensor([1, 2.5])
P["create_nested"] = lambda L: L.Tensor([[1, 2], [3, 4]])
P["create_scalar"] = lambda L: L.Tensor(3.5)
P["create_empty_list"] = lambda L: L.Tensor([])
P["create_ragged"] = lambda L: L.Tensor([[1, 2], [3]])
P["create_dtype_int8"] = lambda L: L.Tensor([1, -2], dtype=L.dtypes.int8)
P["create_dtype_half"] = lambda L: L.Tensor([1.5, 2.25], dtype=L.dtypes.float16)
P["zeros"] = lambda L: L.Tensor.zeros(2, 3)
P["ones_tuple"] = lambda L: L.Tensor.ones((2, 2))
P["full"] = lambda L: L.Tensor.full((2, 2), 7)
P["full_float"] = lambda L: L.Tensor.full((3,), 2.5)
P["full_bool"] = lambda L: L.Tensor.full((2,), True)
P["arange"] = lambda L: L.Tensor.arange(5)
P["arange_float_step"] = lambda L: L.Tensor.arange(0, 1, 0.25)
P["arange_negative_step"] = lambda L: L.Tensor.arange(5, 0, -2)
P["arange_empty"] = lambda L: L.Tensor.arange(3, 3)
P["linspace"] = lambda L: L.Tensor.linspace(0, 1, 5)
P["eye"] = lambda L: L.Tensor.eye(3)
P["eye_rect"] = lambda L: L.Tensor.eye(2, 3)
P["zeros_like"] = lambda L: L.Tensor.zeros_like(L.Tensor([1, 2]))
P["full_like_float"] = lambda L: L.Tensor([1, 2]).full_like(0.5)
P["rand_shape"] = lambda L: (lambda t: (t.shape, t.dtype))(L.Tensor.rand(2, 3))
P["randn_shape"] = lambda L: (lambda t: (t.shape, t.dtype))(L.Tensor.randn(4))
P["randint_range"] = lambda L: (lambda t: (t.shape, t.dtype, bool(((t >= 2) & (t < 5)).all().item())))(
  L.Tensor.randint(10, low=2, high=5))
P["tril"] = lambda L: L.Tensor.ones(3, 3).tril()
P["triu_k"] = lambda L: L.Tensor.ones(3, 3).triu(1)
# ***** elementwise *****
P["add_int"] = lambda L: L.Tensor([1, 2]) + L.Tensor([3, 4])
P["sub_scalar"] = lambda L: L.Tensor([1.0, 2.0]) - 3
P["rsub"] = lambda L: 3 - L.Tensor([1.0, 2.0])
P["mul_broadcast"] = lambda L: _seq(L, 2, 3) * L.Tensor([1.0, 2.0, 3.0])
P["div_float"] = lambda L: L.Tensor([1.0, 2.0]) / L.Tensor([4.0, 8.0])
P["div_int_true"] = lambda L: L.Tensor([7, -7]) / L.Tensor([2, 2])
P["floordiv_int"] = lambda L: L.Tensor([7, -7]) // L.Tensor([2, 2])
P["mod_int"] = lambda L: L.Tensor([7, -7, 7]) % L.Tensor([3, 3, -3])
P["mod_float"] = lambda L: L.Tensor([7.5, -7.5]) % 2
P["pow_float"] = lambda L: L.Tensor([1.0, 2.0, 3.0]) ** 2
P["pow_int"] = lambda L: L.Tensor([2, 3]) ** 2
P["rpow"] = lambda L: 2 ** L.Tensor([1.0, 3.0])
P["neg"] = lambda L: -L.Tensor([1, -2])
P["abs"] = lambda L: L.Tensor([-1.5, 2.0]).abs()
P["relu"] = lambda L: L.Tensor([1, -2, 3]).relu()
P["sigmoid"] = lambda L: L.Tensor([-1.0, 0.0, 2.0]).sigmoid()
P["tanh"] = lambda L: L.Tensor([-1.0, 0.0, 0.5]).tanh()
P["exp_log"] = lambda L: [L.Tensor([0.0, 1.0]).exp(), L.Tensor([1.0, 4.0]).log()]
P["log_negative_nan"] = lambda L: L.Tensor([-1.0, 0.0]).log()
P["sqrt_rsqrt"] = lambda L: [L.Tensor([4.0, 9.0]).sqrt(), L.Tensor([4.0]).rsqrt()]
P["sin_cos"] = lambda L: [L.Tensor([0.0, 1.0]).sin(), L.Tensor([0.0, 1.0]).cos()]
P["gelu"] = lambda L: L.Tensor([-1.0, 0.0, 1.0]).gelu()
P["silu"] = lambda L: L.Tensor([-1.0, 0.0, 1.0]).silu()
P["leaky_relu"] = lambda L: L.Tensor([-1.0, 2.0]).leaky_relu(0.1)
P["softplus"] = lambda L: L.Tensor([-1.0, 0.0, 1.0]).softplus()
P["clip"] = lambda L: L.Tensor([-2.0, 0.5, 3.0]).clip(-1, 1)
P["maximum"] = lambda L: L.Tensor([1, 5]).maximum(L.Tensor([3, 2]))
P["minimum_scalar"] = lambda L: L.Tensor([1.0, 5.0]).minimum(2)
P["where"] = lambda L: L.Tensor([True, False]).where(L.Tensor([1, 2]), L.Tensor([3, 4]))
P["where_scalars"] = lambda L: (L.Tensor([1, 0, 2]) > 0).where(1.5, 0)
P["cmp_eq"] = lambda L: L.Tensor([1, 2, 3]) == 2
P["cmp_lt_float_int"] = lambda L: L.Tensor([1.5, 2.5]) < L.Tensor([2, 2])
P["logical_not"] = lambda L: L.Tensor([True, False]).logical_not()
P["bitwise_and_int"] = lambda L: L.Tensor([6, 3]) & L.Tensor([3, 5])
P["bitwise_or_bool"] = lambda L: L.Tensor([True, False]) | L.Tensor([False, False])
P["xor_int"] = lambda L: L.Tensor([6, 3]) ^ 5
P["lshift"] = lambda L: L.Tensor([1, 2]) << 2
P["rshift"] = lambda L: L.Tensor([8, 16]) >> 2
P["isnan_isinf"] = lambda L: [L.Tensor([float("nan"), 1.0]).isnan(), L.Tensor([float("inf"), 1.0]).isinf()]
P["sign"] = lambda L: L.Tensor([-2.0, 0.0, 3.0]).sign()
P["round_half_even"] = lambda L: L.Tensor([0.5, 1.5, 2.5, -0.5]).round()
P["floor_ceil_trunc"] = lambda L: [L.Tensor([-1.5, 1.5]).floor(), L.Tensor([-1.5, 1.5]).ceil(),
                                   L.Tensor([-1.5, 1.5]).trunc()]
P["lerp"] = lambda L: L.Tensor([0.0, 10.0]).lerp(L.Tensor([10.0, 20.0]), 0.5)
P["int_div_by_zero_float"] = lambda L: L.Tensor([1.0, -1.0, 0.0]) / 0
# ***** dtype promotion *****
P["promo_int_plus_float_scalar"] = lambda L: L.Tensor([1, 2]) + 1.5
P["promo_int_plus_int_scalar"] = lambda L: (L.Tensor([1, 2]) + 1).dtype
P["promo_half_plus_float"] = lambda L: (L.Tensor([1.0], dtype=L.dtypes.float16) + L.Tensor([1.0])).dtype
P["promo_int8_uint8"] = lambda L: (L.Tensor([1], dtype=L.dtypes.int8) + L.Tensor([1], dtype=L.dtypes.uint8)).dtype
P["promo_bool_int"] = lambda L: (L.Tensor([True]) + L.Tensor([1])).dtype
P["promo_bool_plus_bool"] = lambda L: L.Tensor([True, False]) + L.Tensor([True, True])
P["promo_int32_int64"] = lambda L: (L.Tensor([1], dtype=L.dtypes.int32) + L.Tensor([1], dtype=L.dtypes.int64)).dtype
P["promo_bf16_half"] = lambda L: (L.Tensor([1.0], dtype=L.dtypes.bfloat16) +
                                  L.Tensor([1.0], dtype=L.dtypes.float16)).dtype
P["cast_float_to_int"] = lambda L: L.Tensor([1.7, -1.7]).cast(L.dtypes.int32)
P["cast_to_bool"] = lambda L: L.Tensor([0.0, 0.5]).cast(L.dtypes.bool)
P["cast_int_to_uint8_wrap"] = lambda L: L.Tensor([300, -1]).cast(L.dtypes.uint8)
P["bitcast"] = lambda L: L.Tensor([1.0]).bitcast(L.dtypes.int32)
P["float_half"] = lambda L: [L.Tensor([1, 2]).float(), L.Tensor([1, 2]).half()]
P["default_float"] = lambda L: L.dtypes.default_float
P["dtype_itemsize"] = lambda L: [L.dtypes.float16.itemsize, L.dtypes.int64.itemsize, L.dtypes.bool.itemsize]
# ***** reductions *****
P["sum_all"] = lambda L: _seq(L, 2, 3).sum()
P["sum_axis_keepdim"] = lambda L: _seq(L, 2, 3).sum(1, keepdim=True)
P["sum_int_dtype"] = lambda L: L.Tensor([1, 2, 3], dtype=L.dtypes.int8).sum()
P["sum_bool"] = lambda L: L.Tensor([True, True, False]).sum()
P["sum_empty"] = lambda L: L.Tensor([]).sum()
P["mean"] = lambda L: _seq(L, 2, 3).mean(0)
P["mean_int"] = lambda L: L.Tensor([1, 2]).mean()
P["max_min"] = lambda L: [_seq(L, 2, 3).max(1), _seq(L, 2, 3).min()]
P["argmax_ties"] = lambda L: L.Tensor([1, 3, 3, 2]).argmax()
P["argmin_axis"] = lambda L: L.Tensor([[3, 1], [0, 4]]).argmin(axis=1)
P["prod"] = lambda L: L.Tensor([1.0, 2.0, 3.0]).prod()
P["std_var"] = lambda L: [_seq(L, 2, 3).std(), _seq(L, 2, 3).var(1)]
P["std_correction0"] = lambda L: _seq(L, 4).std(correction=0)
P["softmax"] = lambda L: _seq(L, 2, 3).softmax()
P["log_softmax"] = lambda L: _seq(L, 2, 3).log_softmax(0)
P["logsumexp"] = lambda L: _seq(L, 2, 3).logsumexp(1)
P["cumsum"] = lambda L: L.Tensor([1, 2, 3]).cumsum()
P["cumsum_float_axis"] = lambda L: _seq(L, 2, 3).cumsum(1)
P["cummax"] = lambda L: L.Tensor([1.0, 3.0, 2.0]).cummax(0)
P["any_all"] = lambda L: [L.Tensor([0, 1]).any(), L.Tensor([0, 1]).all()]
P["reduce_bad_axis"] = lambda L: _seq(L, 2, 3).sum(5)
P["matmul"] = lambda L: _seq(L, 2, 3) @ _seq(L, 3, 2)
P["matmul_int"] = lambda L: L.Tensor([[1, 2]]) @ L.Tensor([[3], [4]])
P["matmul_vec"] = lambda L: _seq(L, 3) @ _seq(L, 3, 2)
P["matmul_mismatch"] = lambda L: _seq(L, 2, 3) @ _seq(L, 2, 3)
P["dot_batched"] = lambda L: _seq(L, 2, 2, 3).dot(_seq(L, 3, 2))
P["einsum"] = lambda L: L.Tensor.einsum("ij,jk->ik", _seq(L, 2, 3), _seq(L, 3, 2))
# ***** movement *****
P["reshape_infer"] = lambda L: _seq(L, 2, 3).reshape(3, -1)
P["reshape_bad"] = lambda L: _seq(L, 2, 3).reshape(4, 2)
P["permute"] = lambda L: _seq(L, 2, 3, 1).permute(2, 0, 1)
P["transpose"] = lambda L: _seq(L, 2, 3).transpose()
P["T"] = lambda L: _seq(L, 2, 3).T
P["expand"] = lambda L: L.Tensor([[1], [2]]).expand(2, 3)
P["expand_bad"] = lambda L: L.Tensor([[1, 2]]).expand(2, 3)
P["flatten_unflatten"] = lambda L: [_seq(L, 2, 3).flatten(), _seq(L, 6).unflatten(0, (2, 3))]
P["squeeze_unsqueeze"] = lambda L: [_seq(L, 1, 3, 1).squeeze(), _seq(L, 3).unsqueeze(0).shape]
P["squeeze_dim_not_one"] = lambda L: _seq(L, 2, 3).squeeze(0)
P["flip"] = lambda L: _seq(L, 2, 3).flip(1)
P["pad"] = lambda L: L.Tensor([[1, 2]]).pad(((0, 0), (1, 2)))
P["pad_value"] = lambda L: L.Tensor([1.0, 2.0]).pad((1, 1), value=-1)
P["pad_negative"] = lambda L: _seq(L, 5).pad((-1, -2))
P["shrink"] = lambda L: _seq(L, 3, 3).shrink(((0, 2), (1, 3)))
P["cat"] = lambda L: _seq(L, 2, 2).cat(_seq(L, 1, 2))
P["cat_dim1"] = lambda L: L.Tensor.cat(_seq(L, 2, 1), _seq(L, 2, 2), dim=1)
P["stack"] = lambda L: L.Tensor.stack(L.Tensor([1, 2]), L.Tensor([3, 4]), dim=1)
P["repeat"] = lambda L: L.Tensor([1, 2]).repeat(2, 2)
P["split_chunk"] = lambda L: [list(_seq(L, 5).split(2)), list(_seq(L, 5).chunk(2))]
P["roll"] = lambda L: L.Tensor([1, 2, 3, 4]).roll(1)
P["view_alias"] = lambda L: _seq(L, 4).view(2, 2)
P["contiguous_T"] = lambda L: _seq(L, 2, 3).T.contiguous()
# ***** indexing *****
P["index_int"] = lambda L: _seq(L, 3, 4)[1]
P["index_negative"] = lambda L: _seq(L, 3, 4)[-1, -2]
P["index_slice_step"] = lambda L: _seq(L, 8)[1:7:2]
P["index_neg_step"] = lambda L: _seq(L, 5)[::-2]
P["index_none_ellipsis"] = lambda L: _seq(L, 2, 3)[None, ..., 1]
P["index_tensor"] = lambda L: _seq(L, 4, 2)[L.Tensor([3, 0, 3])]
P["index_tensor_2d"] = lambda L: _seq(L, 3, 3)[L.Tensor([0, 2]), L.Tensor([1, 0])]
P["index_list"] = lambda L: _seq(L, 5)[[0, 4]]
P["index_bool_scalar_mask"] = lambda L: _seq(L, 3)[True].shape
P["index_out_of_range"] = lambda L: _seq(L, 3)[5]
P["index_too_many"] = lambda L: _seq(L, 3)[0, 0]
P["gather"] = lambda L: _seq(L, 2, 3).gather(1, L.Tensor([[2, 0], [1, 1]]))
P["scatter"] = lambda L: L.Tensor.zeros(2, 3).scatter(1, L.Tensor([[0], [2]]), L.Tensor([[5.0], [7.0]]))
P["masked_fill"] = lambda L: _seq(L, 3).masked_fill(L.Tensor([True, False, True]), 0.0)
P["setitem_int"] = lambda L: _setitem(L, 1, 9.0)
P["setitem_slice_tensor"] = lambda L: _setitem(L, (slice(0, 2), slice(1, 3)), L.Tensor([[1.0, 2.0], [3.0, 4.0]]))
P["setitem_broadcast_row"] = lambda L: _setitem(L, (slice(None), 0), L.Tensor([7.0, 8.0, 9.0]))
P["setitem_step_slice"] = lambda L: _setitem(L, (0, slice(None, None, 2)), 5.0)
P["setitem_tensor_index"] = lambda L: _setitem(L, L.Tensor([0, 2]), 1.0)
P["setitem_lazy"] = lambda L: (lambda t: (t.__setitem__(0, 3.0), t)[1])(L.Tensor([1.0, 2.0]) + 0)
P["assign"] = lambda L: (lambda t: (t.assign(L.Tensor([5.0, 6.0])).realize(), t)[1])(L.Tensor([1.0, 2.0]).realize())
P["assign_shape_mismatch"] = lambda L: L.Tensor([1.0, 2.0]).realize().assign(L.Tensor([1.0, 2.0, 3.0]))
# ***** autograd *****
P["grad_mul"] = lambda L: _grad_of(L, lambda x, y: x * y, [1.0, 2.0], [3.0, 4.0])
P["grad_relu_at_zero"] = lambda L: _grad_of(L, lambda x: x.relu(), [-1.0, 0.0, 1.0])
P["grad_max_ties"] = lambda L: _grad_of(L, lambda x: x.max(), [1.0, 3.0, 3.0])
P["grad_matmul"] = lambda L: _grad_of(L, lambda a, b: a @ b, [[1.0, 2.0]], [[3.0], [4.0]])
P["grad_softmax"] = lambda L: _grad_of(L, lambda x: x.softmax() * L.Tensor([1.0, 2.0, 3.0]), [0.1, 0.2, 0.3])
P["grad_sqrt_zero"] = lambda L: _grad_of(L, lambda x: x.sqrt(), [0.0, 4.0])
P["grad_abs_zero"] = lambda L: _grad_of(L, lambda x: x.abs(), [-1.0, 0.0, 2.0])
P["grad_where"] = lambda L: _grad_of(L, lambda x: (x > 0).where(x * 2, x * 3), [-1.0, 1.0])
P["grad_pow"] = lambda L: _grad_of(L, lambda x: x ** 3, [2.0, -1.0])
P["grad_index"] = lambda L: _grad_of(L, lambda x: x[L.Tensor([0, 0, 2])], [1.0, 2.0, 3.0])
P["gradient_api"] = lambda L: (lambda x: list((x * x).sum().gradient(x)))(L.Tensor([1.0, 3.0]))
P["backward_no_requires_grad"] = lambda L: (lambda x: ((x * x).sum().backward(), x.grad)[1])(L.Tensor([1.0, 2.0]))
P["backward_nonscalar"] = lambda L: _grad_of(L, lambda x: (x * 2).unsqueeze(0), [1.0, 2.0])  # sum() of (1, 2)
P["backward_nonscalar_direct"] = _backward_nonscalar
P["detach_grad"] = lambda L: _grad_of(L, lambda x: x * x.detach(), [2.0, 3.0])
# ***** nn layers *****
P["nn_linear"] = lambda L: _linear(L)(L.Tensor([[1.0, 2.0, 3.0]]))
P["nn_linear_shape_error"] = lambda L: _linear(L)(L.Tensor([[1.0, 2.0]]))
P["nn_layernorm"] = lambda L: L.nn.LayerNorm(3)(_seq(L, 2, 3))
P["nn_rmsnorm"] = lambda L: L.nn.RMSNorm(3)(_seq(L, 2, 3))
P["nn_groupnorm"] = lambda L: L.nn.GroupNorm(2, 4)(_seq(L, 1, 4, 2))
P["nn_batchnorm_eval"] = lambda L: L.nn.BatchNorm(2)(_seq(L, 2, 2, 2))
P["nn_batchnorm_train_stats"] = _batchnorm_train
P["nn_batchnorm_num_batches_dtype"] = lambda L: L.nn.BatchNorm(2).num_batches_tracked.dtype
P["nn_embedding"] = lambda L: (lambda e: (setattr(e, "weight", _seq(L, 4, 2)), e(L.Tensor([[3, 0, 1]])))[1])(
  L.nn.Embedding(4, 2))
P["nn_embedding_float_index"] = lambda L: L.nn.Embedding(4, 2)(L.Tensor([1.0]))
P["nn_conv2d"] = lambda L: (lambda c: (setattr(c, "weight", _seq(L, 1, 1, 2, 2)), setattr(c, "bias", L.Tensor([0.5])),
                                       c(_seq(L, 1, 1, 3, 3)))[2])(L.nn.Conv2d(1, 1, 2))
P["nn_conv2d_shapes"] = lambda L: [L.nn.Conv2d(3, 4, 3, stride=2, padding=1)(L.Tensor.ones(1, 3, 8, 8)).shape,
                                   L.nn.Conv2d(2, 2, 3, padding="same")(L.Tensor.ones(1, 2, 5, 5)).shape]
P["nn_conv1d_shape"] = lambda L: L.nn.Conv1d(2, 3, 3)(L.Tensor.ones(1, 2, 6)).shape
P["nn_convtranspose_shape"] = lambda L: L.nn.ConvTranspose2d(2, 3, 3, stride=2)(L.Tensor.ones(1, 2, 4, 4)).shape
P["nn_lstmcell_shape"] = lambda L: [t.shape for t in L.nn.LSTMCell(3, 4)(L.Tensor.ones(2, 3))]
P["nn_state_dict_keys"] = lambda L: sorted(L.nn.state.get_state_dict(
  types.SimpleNamespace(a=L.nn.Linear(2, 2), b=[L.nn.BatchNorm(2)])).keys())
P["nn_parameters_count"] = lambda L: len(L.nn.state.get_parameters([L.nn.Linear(2, 3), L.nn.LayerNorm(3)]))
P["nn_load_state_dict_shape_error"] = lambda L: L.nn.state.load_state_dict(
  L.nn.Linear(2, 2), {"weight": L.Tensor.zeros(3, 2), "bias": L.Tensor.zeros(2)}, verbose=False)
P["nn_load_state_dict_missing"] = lambda L: L.nn.state.load_state_dict(
  L.nn.Linear(2, 2), {"weight": L.Tensor.zeros(2, 2)}, verbose=False)
P["nn_load_state_dict_scalar_vs_vec"] = lambda L: (lambda bn: (L.nn.state.load_state_dict(
  bn, {**L.nn.state.get_state_dict(bn), "num_batches_tracked": L.Tensor([5])}, verbose=False),
  bn.num_batches_tracked)[1])(L.nn.BatchNorm(2))
P["scaled_dot_product_attention"] = lambda L: _seq(L, 1, 2, 3).scaled_dot_product_attention(
  _seq(L, 1, 2, 3) * 0.5, _seq(L, 1, 2, 3), is_causal=True)
P["conv2d_method"] = lambda L: _seq(L, 1, 1, 3, 3).conv2d(_seq(L, 2, 1, 2, 2))
P["max_pool2d"] = lambda L: _seq(L, 1, 1, 4, 4).max_pool2d()
P["avg_pool2d"] = lambda L: _seq(L, 1, 1, 4, 4).avg_pool2d()
P["cross_entropy"] = lambda L: _seq(L, 2, 3).cross_entropy(L.Tensor([2, 0]))
P["sparse_categorical_crossentropy"] = lambda L: _seq(L, 2, 3).sparse_categorical_crossentropy(L.Tensor([1, 2]))
P["binary_crossentropy_logits"] = lambda L: L.Tensor([0.5, -1.0]).binary_crossentropy_logits(L.Tensor([1.0, 0.0]))
P["one_hot"] = lambda L: L.Tensor([0, 2]).one_hot(3)
P["dropout_eval_identity"] = lambda L: _seq(L, 4).dropout(0.5)
# ***** optimizers *****
P["optim_sgd"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.SGD(p, lr=0.1))
P["optim_sgd_momentum_nesterov"] = lambda L: _train_step(
  L, lambda L, p: L.nn.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01))
P["optim_adam"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.Adam(p, lr=0.1))
P["optim_adamw"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.AdamW(p, lr=0.1, weight_decay=0.1))
P["optim_lamb"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.LAMB(p, lr=0.1))
P["optim_lars"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.LARS(p, lr=0.1))
P["optim_step_without_training"] = lambda L: (lambda w: L.nn.optim.SGD([w]).step())(L.Tensor([1.0]))
P["optim_negative_lr"] = lambda L: L.nn.optim.SGD([L.Tensor([1.0])], lr=-1.0)
P["optim_state_dict_keys"] = lambda L: sorted(L.nn.state.get_state_dict(
  L.nn.optim.Adam([L.Tensor([1.0, 2.0])])).keys())
# ***** Context, Variables, TinyJit *****
P["context_debug"] = _context_debug
P["context_unknown_var"] = lambda L: L.Context(NOT_A_CONTEXT_VAR_35=1).__enter__()
P["variable_bind_slice"] = lambda L: _seq(L, 6)[:L.Variable("i", 1, 6).bind(4)].sum()
P["variable_unbind"] = lambda L: list(L.Variable("i", 1, 6).bind(4).unbind()[1:])
P["variable_bind_out_of_range"] = lambda L: L.Variable("i", 1, 6).bind(9)
P["variable_slice_2d"] = lambda L: _seq(L, 2, 8)[:, :L.Variable("j", 1, 8).bind(6)].sum(1)
P["variable_slice_start"] = lambda L: _seq(L, 8)[L.Variable("k", 0, 7).bind(5):].sum()
P["jit_values"] = _jit_values
P["jit_variable"] = _jit_var
P["jit_shape_change"] = lambda L: (lambda f: [f(L.Tensor([1.0, 2.0])).tolist() for _ in range(3)] +
                                   [f(L.Tensor([1.0, 2.0, 3.0])).tolist()])(L.TinyJit(lambda x: (x * 2).realize()))
P["jit_prune"] = lambda L: (lambda w: (lambda f: [f(L.Tensor([float(i)] * 2)).tolist() for i in range(4)])(
  L.TinyJit(lambda x: (x + (w * 2).contiguous()).realize(), prune=True)))(L.Tensor([1.0, 2.0]).realize())
# ***** misc tensor API *****
P["item_multi_element"] = lambda L: L.Tensor([1, 2]).item()
P["numel_ndim_shape"] = lambda L: [_seq(L, 2, 3).numel(), _seq(L, 2, 3).ndim, list(_seq(L, 2, 3).shape)]
P["tolist_scalar"] = lambda L: L.Tensor(2.5).tolist()
P["len"] = lambda L: len(_seq(L, 3, 2))
P["len_scalar"] = lambda L: len(L.Tensor(1.0))
P["bool_ambiguous"] = lambda L: bool(L.Tensor([1, 2]))
P["topk"] = lambda L: list(L.Tensor([1.0, 5.0, 3.0, 4.0]).topk(2))
P["sort"] = lambda L: list(L.Tensor([3.0, 1.0, 2.0]).sort())
P["interpolate"] = lambda L: _seq(L, 1, 1, 2, 2).interpolate((4, 4), mode="nearest")
P["multinomial_shape"] = lambda L: L.Tensor([0.0, 1.0, 0.0]).multinomial(4, replacement=True)
P["nonzero_like_masked_select"] = lambda L: L.Tensor([[1, 0], [0, 1]]).sum(0)
P["triu_on_int"] = lambda L: L.Tensor([[1, 2], [3, 4]]).triu()
P["clone_requires"] = lambda L: L.Tensor([1.0]).clone()
P["meshgrid"] = lambda L: list(L.Tensor([1, 2]).meshgrid(L.Tensor([3, 4, 5])))
P["diag"] = lambda L: L.Tensor([1, 2, 3]).diag()
P["dot_vectors"] = lambda L: L.Tensor([1.0, 2.0]).dot(L.Tensor([3.0, 4.0]))
P["isclose_allclose"] = lambda L: [L.Tensor([1.0, 2.0]).isclose(L.Tensor([1.0, 2.1])),
                                   L.Tensor([1.0]).allclose(L.Tensor([1.0 + 1e-9]))]

# ***** more nn / optim / state / jit *****
P["nn_batchnorm_no_affine_no_stats"] = lambda L: L.nn.BatchNorm(2, affine=False, track_running_stats=False)(
  _seq(L, 3, 2, 2))
P["nn_layernorm_no_affine"] = lambda L: L.nn.LayerNorm((2, 3), elementwise_affine=False)(_seq(L, 2, 2, 3))
P["nn_layernorm2d"] = lambda L: L.nn.LayerNorm2d(2)(_seq(L, 1, 2, 2, 2))
P["nn_instancenorm"] = lambda L: L.nn.InstanceNorm(2)(_seq(L, 1, 2, 3))
# (a half result: tinygrad's PYTHON device keeps halves unrounded, so the test compares them to half precision)
P["nn_rmsnorm_half"] = lambda L: L.nn.RMSNorm(3)(_seq(L, 2, 3, dtype=L.dtypes.float16)).cast(L.dtypes.float16)
P["nn_conv2d_groups_dilation"] = lambda L: _set(L, L.nn.Conv2d(2, 2, 2, dilation=2, groups=2), bias=[0.0, 1.0],
                                                weight=[[[[1.0, 2.0], [3.0, 4.0]]], [[[0.5, 0.0], [0.0, -1.0]]]])(
  _seq(L, 1, 2, 4, 4))
P["nn_convtranspose2d_values"] = lambda L: _set(L, L.nn.ConvTranspose2d(1, 1, 2, stride=2), bias=[0.5],
                                                weight=[[[[1.0, 2.0], [3.0, 4.0]]]])(_seq(L, 1, 1, 2, 2))
P["nn_conv1d_padding_same"] = lambda L: _set(L, L.nn.Conv1d(1, 1, 3, padding="same"), bias=[0.0],
                                             weight=[[[1.0, 0.0, -1.0]]])(_seq(L, 1, 1, 5))
P["nn_lstmcell_values"] = lambda L: list(_set(
  L, L.nn.LSTMCell(2, 1), weight_ih=[[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]],
  weight_hh=[[0.1], [-0.1], [0.2], [-0.2]], bias_ih=[0.0, 0.1, 0.0, 0.1], bias_hh=[0.1, 0.0, 0.1, 0.0])(
  L.Tensor([[1.0, -1.0]]), (L.Tensor([[0.5]]), L.Tensor([[-0.5]]))))
P["nn_embedding_grad"] = _embedding_grad
P["nn_linear_no_bias_grad"] = lambda L: _grad_of(L, lambda x: _set(L, L.nn.Linear(2, 2, bias=False),
                                                                 weight=[[1.0, 2.0], [3.0, 4.0]])(x), [[1.0, 1.0]])
P["nn_state_dict_nested"] = lambda L: sorted(L.nn.state.get_state_dict(
  {"blocks": [L.nn.LayerNorm(2), {"x": L.nn.Linear(1, 1, bias=False)}], "t": L.Tensor([1.0])}).keys())
P["nn_parameters_shared_dedup"] = lambda L: (lambda lin: len(L.nn.state.get_parameters([lin, lin])))(
  L.nn.Linear(2, 2))
P["nn_load_state_dict_consume"] = lambda L: (lambda sd: (L.nn.state.load_state_dict(
  L.nn.Linear(1, 1), sd, verbose=False, consume=True), sorted(sd))[1])(
  {"weight": L.Tensor([[2.0]]), "bias": L.Tensor([1.0]), "extra": L.Tensor([0.0])})
P["nn_load_state_dict_not_strict"] = lambda L: (lambda lin: (L.nn.state.load_state_dict(
  lin, {"weight": L.Tensor([[2.0]])}, strict=False, verbose=False), lin.weight)[1])(L.nn.Linear(1, 1))
P["nn_load_state_dict_casts"] = lambda L: (lambda lin: (L.nn.state.load_state_dict(
  lin, {"weight": L.Tensor([[2.0]], dtype=L.dtypes.float16), "bias": L.Tensor([1.0])}, verbose=False),
  lin.weight)[1])(L.nn.Linear(1, 1))
P["nn_safetensors_roundtrip"] = _safetensors_roundtrip
P["optim_muon"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.Muon(p, lr=0.05))
P["optim_sgd_classic_wd"] = lambda L: _train_step(
  L, lambda L, p: L.nn.optim.SGD(p, lr=0.05, momentum=0.5, weight_decay=0.1, classic=True))
P["optim_lamb_wd"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.LAMB(p, lr=0.05, weight_decay=0.1))
P["optim_adam_fused"] = lambda L: _train_step(L, lambda L, p: L.nn.optim.Adam(p, lr=0.1, fused=True))
P["optim_group"] = _optimizer_group
P["optim_negative_momentum"] = lambda L: L.nn.optim.SGD([L.Tensor([1.0])], momentum=-0.5)
P["optim_negative_weight_decay"] = lambda L: L.nn.optim.LAMB([L.Tensor([1.0])], weight_decay=-0.5)
P["optim_lr_dtype"] = lambda L: L.nn.optim.SGD([L.Tensor([1.0])], lr=0.1).lr.dtype
P["jit_kwargs_dict"] = _jit_kwargs_dict
P["jit_optimizer_step"] = _jit_optimizer_step
P["jit_non_tensor_return"] = lambda L: [L.TinyJit(lambda x: ((x + 1).realize(), 3))(L.Tensor([1.0])) for _ in range(3)]

# ***** more ops *****
P["sum_acc_dtype_half"] = lambda L: L.Tensor([1.0, 2.0], dtype=L.dtypes.float16).sum().dtype
P["sum_uint8_dtype"] = lambda L: L.Tensor([200, 100], dtype=L.dtypes.uint8).sum()
P["mean_half_dtype"] = lambda L: L.Tensor([1.0, 2.0], dtype=L.dtypes.float16).mean().dtype
P["max_int_axis_keepdim"] = lambda L: L.Tensor([[1, 5], [7, 2]]).max(axis=0, keepdim=True)
P["min_bool"] = lambda L: L.Tensor([True, False]).min()
P["argmax_keepdim"] = lambda L: _seq(L, 2, 3).argmax(1, keepdim=True)
P["var_single_element"] = lambda L: L.Tensor([1.0]).var()
P["softmax_half_dtype"] = lambda L: _seq(L, 3, dtype=L.dtypes.float16).softmax().dtype
P["floordiv_negative_divisor"] = lambda L: L.Tensor([-7, 7]) // L.Tensor([2, -2])
P["int_mul_overflow_int8"] = lambda L: L.Tensor([100], dtype=L.dtypes.int8) * 2
P["exp2_log2"] = lambda L: [L.Tensor([3.0]).exp2(), L.Tensor([8.0]).log2()]
P["reciprocal"] = lambda L: L.Tensor([2.0, 4.0]).reciprocal()
P["square_cube"] = lambda L: [L.Tensor([3]).square(), L.Tensor([2.0]) ** 3]
P["erf"] = lambda L: L.Tensor([0.0, 0.5, -1.0]).erf()
P["hardtanh_relu6"] = lambda L: [L.Tensor([-2.0, 0.5, 7.0]).hardtanh(), L.Tensor([-2.0, 7.0]).relu6()]
P["elu_selu"] = lambda L: [L.Tensor([-1.0, 1.0]).elu(), L.Tensor([-1.0, 1.0]).selu()]
P["mish_swish"] = lambda L: [L.Tensor([-1.0, 1.0]).mish(), L.Tensor([-1.0, 1.0]).swish()]
P["logical_ops_int_error"] = lambda L: L.Tensor([1.5]) & L.Tensor([2.5])
P["where_dtype_promo"] = lambda L: L.Tensor([True, False]).where(L.Tensor([1]), L.Tensor([2.5]))
P["cast_neg_float_to_uint"] = lambda L: L.Tensor([3.7]).cast(L.dtypes.uint8)
P["movement_errors_permute"] = lambda L: _seq(L, 2, 3).permute(0, 0)
P["movement_pad_reflect"] = lambda L: L.Tensor([1.0, 2.0, 3.0]).pad((2, 1), mode="reflect")
P["movement_pad_replicate"] = lambda L: L.Tensor([[1.0, 2.0]]).pad((1, 2), mode="replicate")
P["movement_shrink_to"] = lambda L: _seq(L, 3, 4).shrink_to(2, 2)
P["movement_unfold_like"] = lambda L: _seq(L, 6).reshape(2, 3).transpose(0, 1).flatten()
P["index_setitem_neg_slice"] = lambda L: _setitem(L, (slice(None), slice(-2, None)), 0.0)
P["index_getitem_tensor_neg"] = lambda L: _seq(L, 4)[L.Tensor([-1, -4])]
P["index_slice_out_of_range_clamps"] = lambda L: _seq(L, 4)[2:10]
P["gather_negative_dim"] = lambda L: _seq(L, 2, 3).gather(-1, L.Tensor([[0], [2]]))
P["cat_mixed_dtype"] = lambda L: L.Tensor.cat(L.Tensor([1]), L.Tensor([2.5]))
P["stack_shape_mismatch"] = lambda L: L.Tensor.stack(L.Tensor([1, 2]), L.Tensor([3]))
P["grad_mean_var"] = lambda L: _grad_of(L, lambda x: x.var() + x.mean(), [1.0, 2.0, 4.0])
P["grad_cumsum"] = lambda L: _grad_of(L, lambda x: x.cumsum() * L.Tensor([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0])
P["grad_logsumexp"] = lambda L: _grad_of(L, lambda x: x.logsumexp(), [1.0, 2.0, 3.0])
P["grad_conv2d"] = lambda L: _grad_of(L, lambda x, w: x.conv2d(w), [[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0],
                                                                      [7.0, 8.0, 9.0]]]], [[[[1.0, -1.0]]]])
P["grad_cross_entropy"] = lambda L: _grad_of(L, lambda x: x.cross_entropy(L.Tensor([1, 0])),
                                             [[1.0, 2.0, 0.5], [0.1, 0.2, 0.3]])

# ***** more jit / optim / nn / variables *****
P["jit_list_input"] = _jit_list_input
P["jit_duplicate_input"] = _jit_duplicate_input
P["jit_returns_input"] = lambda L: (lambda f: [f(L.Tensor([1.0])).tolist() for _ in range(3)])(L.TinyJit(lambda x: x))
P["optim_unused_param"] = _optim_unused_param
P["optim_lr_assign"] = _optim_lr_assign
P["nn_linear_3d_input"] = lambda L: _linear(L)(_seq(L, 2, 2, 3))
P["nn_embedding_2d_index_shape"] = lambda L: L.nn.Embedding(5, 3)(L.Tensor([[0, 1], [2, 4], [3, 3]])).shape
P["nn_conv2d_padding_tuple"] = lambda L: L.nn.Conv2d(1, 1, 3, padding=(1, 2))(L.Tensor.ones(1, 1, 4, 4)).shape
P["nn_batchnorm_momentum"] = lambda L: (lambda bn: (_bn_train(L, bn, 2), [bn.running_mean, bn.running_var])[1])(
  L.nn.BatchNorm(2, momentum=0.5))
P["variable_attrs"] = lambda L: (lambda v: [v.vmin, v.vmax, v.unbind()[1]])(L.Variable("q", 2, 9).bind(4))
P["variable_ones"] = lambda L: L.Tensor.ones(L.Variable("r", 1, 8).bind(5)).sum()
P["variable_mul_index"] = lambda L: _seq(L, 10)[L.Variable("s", 0, 4).bind(3) * 2]

PROGRAMS: dict[str, Callable] = P

if __name__ == "__main__":  # the subprocess side: run every program with the library named in argv[1], print JSON
  results = run_all(load_library(sys.argv[1]), sys.argv[2:] or None)
  print(json.dumps(results))
