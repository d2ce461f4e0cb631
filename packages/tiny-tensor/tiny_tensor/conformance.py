"""The device conformance suite: does a device (ours or a third party's plugin) compute what numpy computes?

    python -m tiny_tensor.conformance --device CPU          # or PYTHON, MOCK+AMD, CPU:CLANG, MYDEV, ...
    python -m tiny_tensor.conformance --device MYDEV --only ops,views --verbose

It runs small checks in six groups against numpy and prints a table (group, check, result, time, detail); the exit
status is 1 when any check fails, 0 otherwise. A check the device cannot run by design (a dtype its renderer does not
support, a JIT graph on a device without `Compiled.graph`) is reported ``n/a`` with the reason and is no failure.

- ops: elementwise float and int arithmetic, comparisons, unary math, reductions, matmul;
- nn: a 3x3 conv, softmax, float16 (where the renderer has it) and bfloat16 (through float32 where the renderer lacks
  it) matmuls;
- views: reshape/permute/expand, pad/shrink/flip, slicing, views of realized buffers (the scheduler's zero-copy SLICE,
  through the allocator's `_offset` or a copy without it), in-place assign;
- copies: host round trips of odd sizes, copies to and from another device;
- dtypes: every dtype the device's renderer supports: host round trip, arithmetic, casts;
- jit: `TinyJit` capture and replay with new inputs, with a symbolic `Variable`;
- graph: a device graph (`Compiled.graph`) replaying a multi-kernel JIT, and a two-layer MLP forward and backward.

`--speed` then prints GEMM TFLOPS (float16 where supported, and bfloat16), device copy GB/s and the
host µs of a TinyJit replay, with torch's figures on `--torch DEVICE` (e.g. cuda) when torch is installed. `--plugin
NAME=module:Class` registers a device class without installed entry points (a bare source tree on PYTHONPATH).

From Python: `run(device)` returns the `Result`s, `format_table(results)` the table. A plugin package's own tests
call it (see examples/plugin-template) as ``assert not [r for r in run("MYDEV") if r.status == "FAIL"]``.
"""
from __future__ import annotations

import argparse
import functools
import operator
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike

from tiny_uop.dtype import DType, dtypes, to_numpy
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device
from tiny_uop.target import Target

__all__ = ["Result", "NotApplicable", "GROUPS", "CHECKS", "run", "format_table", "main"]

GROUPS = ("ops", "nn", "views", "copies", "dtypes", "jit", "graph")


class NotApplicable(Exception):
  """Raised by a check that the device cannot run by design; the message says why (reported as ``n/a``)."""


@dataclass(frozen=True)
class Result:
  """One check's outcome: status is "pass", "FAIL" or "n/a"; detail says why it failed or does not apply."""
  group: str
  name: str
  status: str
  seconds: float
  detail: str = ""


@dataclass(frozen=True)
class Check:
  group: str
  name: str
  fn: Callable[[str], None]   # called with the canonical device name, inside Context(DEV=the device string)


CHECKS: list[Check] = []


def check(group: str, name: str) -> Callable[[Callable[[str], None]], Callable[[str], None]]:
  """Register a check: a function of the device name that raises AssertionError (or any error) on failure."""
  assert group in GROUPS, group
  def deco(fn: Callable[[str], None]) -> Callable[[str], None]:
    CHECKS.append(Check(group, name, fn))
    return fn
  return deco


# ***** helpers *****
def _rng(seed: int) -> np.random.Generator: return np.random.default_rng(seed)


def _close(got: ArrayLike, want: ArrayLike, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy's is {want.shape}"
  if want.dtype.kind in "biu": ok, err = np.array_equal(got, want), "values differ"
  else:
    ok = np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    err = f"max abs error {np.nanmax(diff) if diff.size else 0:.3g}"
  assert ok, f"{what}: {err}\n got {got.ravel()[:8]}\nwant {want.ravel()[:8]}"


def _T(arr: np.ndarray, dev: str):  # noqa: ANN202 -- Tensor, imported lazily
  from tiny_tensor import Tensor
  return Tensor(arr, device=dev)


def _supports(dev: str, dt: DType) -> bool:
  return dt in Device[dev].renderer.supported_dtypes()


def _other_device(dev: str) -> str:
  """A second device to copy to and from: CPU, or PYTHON when the device under test is the CPU."""
  return "PYTHON" if Target.parse(dev).device == "CPU" else "CPU"


# ***** ops *****
@check("ops", "elementwise float32")
def _elementwise(dev: str) -> None:
  r = _rng(0)
  a, b = r.standard_normal((4, 5)).astype(np.float32), r.standard_normal((4, 5)).astype(np.float32)
  b[np.abs(b) < 0.1] = 0.5
  ta, tb = _T(a, dev), _T(b, dev)
  for what, t, n in (("a+b", ta + tb, a + b), ("a*b", ta * tb, a * b), ("a-b", ta - tb, a - b),
                     ("a/b", ta / tb, a / b), ("max", ta.maximum(tb), np.maximum(a, b)), ("-a", -ta, -a),
                     ("relu", ta.relu(), np.maximum(a, 0)), ("where", (ta < tb).where(ta, tb), np.where(a < b, a, b)),
                     ("a*2+1", ta * 2 + 1, a * 2 + 1), ("broadcast", ta + tb[0], a + b[0])):
    _close(t.numpy(), n, what)


@check("ops", "unary math")
def _unary(dev: str) -> None:
  x = _rng(1).uniform(-3, 3, 64).astype(np.float32)
  t = _T(x, dev)
  for what, got, want in (("exp", t.exp(), np.exp(x)), ("log", (t.abs() + 0.5).log(), np.log(np.abs(x) + 0.5)),
                          ("sqrt", t.abs().sqrt(), np.sqrt(np.abs(x))), ("sin", t.sin(), np.sin(x)),
                          ("exp2", t.exp2(), np.exp2(x)),
                          ("reciprocal", (t.abs() + 1).reciprocal(), 1 / (np.abs(x) + 1)),
                          ("tanh", t.tanh(), np.tanh(x)), ("sigmoid", t.sigmoid(), 1 / (1 + np.exp(-x)))):
    _close(got.numpy(), want, what, rtol=2e-5, atol=2e-6)


@check("ops", "int32 arithmetic")
def _int_ops(dev: str) -> None:
  r = _rng(2)
  a, b = r.integers(0, 1000, 32).astype(np.int32), r.integers(1, 50, 32).astype(np.int32)
  ta, tb = _T(a, dev), _T(b, dev)
  for what, got, want in (("a+b", ta + tb, a + b), ("a*b", ta * tb, a * b), ("a-b", ta - tb, a - b),
                          ("a//b", ta // tb, a // b), ("a%b", ta % tb, a % b), ("a&b", ta & tb, a & b),
                          ("a|b", ta | tb, a | b), ("a^b", ta ^ tb, a ^ b), ("a<<2", ta << 2, a << 2),
                          ("a>>3", ta >> 3, a >> 3), ("max", ta.maximum(tb), np.maximum(a, b))):
    _close(got.numpy(), want, what)


@check("ops", "comparisons")
def _compare(dev: str) -> None:
  r = _rng(3)
  a, b = r.integers(0, 4, 20).astype(np.float32), r.integers(0, 4, 20).astype(np.float32)
  ta, tb = _T(a, dev), _T(b, dev)
  for what, got, want in (("<", ta < tb, a < b), ("==", ta == tb, a == b), ("!=", ta != tb, a != b),
                          (">=", ta >= tb, a >= b), ("not", (ta < tb).logical_not(), ~(a < b))):
    _close(got.numpy(), want, what)


@check("ops", "reductions")
def _reduce(dev: str) -> None:
  x = _rng(4).standard_normal((6, 7, 5)).astype(np.float32)
  t = _T(x, dev)
  for what, got, want in (("sum", t.sum(), x.sum()), ("sum(0)", t.sum(0), x.sum(0)), ("sum(2)", t.sum(2), x.sum(2)),
                          ("max(1)", t.max(1), x.max(1)), ("min", t.min(), x.min()), ("mean(1)", t.mean(1), x.mean(1)),
                          ("prod(2)", t.prod(2), x.prod(2)), ("argmax(1)", t.argmax(1), x.argmax(1)),
                          ("softmax", t.softmax(-1), np.exp(x) / np.exp(x).sum(-1, keepdims=True))):
    _close(got.numpy(), want, what, rtol=1e-4, atol=1e-5)


@check("ops", "matmul")
def _matmul(dev: str) -> None:
  r = _rng(5)
  a, b = r.standard_normal((9, 17)).astype(np.float32), r.standard_normal((17, 5)).astype(np.float32)
  _close((_T(a, dev) @ _T(b, dev)).numpy(), a @ b, "a@b", rtol=1e-4, atol=1e-4)
  c = r.standard_normal((3, 4, 6)).astype(np.float32)
  d = r.standard_normal((3, 6, 2)).astype(np.float32)
  _close((_T(c, dev) @ _T(d, dev)).numpy(), c @ d, "batched", rtol=1e-4, atol=1e-4)


# ***** nn *****
@check("nn", "conv2d 3x3")
def _conv(dev: str) -> None:
  r = _rng(30)
  x, w = r.standard_normal((2, 3, 9, 9)).astype(np.float32), r.standard_normal((4, 3, 3, 3)).astype(np.float32)
  want = np.zeros((2, 4, 7, 7), np.float32)
  for i in range(3):
    for j in range(3): want += np.einsum("bchw,oc->bohw", x[:, :, i:i + 7, j:j + 7], w[:, :, i, j])
  _close(_T(x, dev).conv2d(_T(w, dev)).numpy(), want, "conv2d", rtol=1e-4, atol=1e-4)


@check("nn", "softmax")
def _softmax(dev: str) -> None:
  a = _rng(31).standard_normal((5, 33)).astype(np.float32) * 4
  e = np.exp(a - a.max(1, keepdims=True))
  _close(_T(a, dev).softmax(1).numpy(), e / e.sum(1, keepdims=True), "softmax", rtol=1e-5, atol=1e-6)


_NAMES = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16"}  # torch's names too


def _round_bf16(x: np.ndarray) -> np.ndarray:
  """float32 values rounded to bfloat16 (to nearest even), as float32."""
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@check("nn", "half-precision matmul")
def _half_matmul(dev: str) -> None:
  r = _rng(32)
  a, b = r.standard_normal((16, 40)).astype(np.float32), r.standard_normal((40, 24)).astype(np.float32)
  for dt, rnd in ((dtypes.float16, lambda x: x.astype(np.float16).astype(np.float32)), (dtypes.bfloat16, _round_bf16)):
    if dt == dtypes.float16 and not _supports(dev, dt): continue  # bfloat16 runs through float32 where unsupported
    got = (_T(a, dev).cast(dt) @ _T(b, dev).cast(dt)).cast(dtypes.float32).numpy()
    _close(got, rnd(rnd(a) @ rnd(b)), f"{_NAMES[dt]} matmul", rtol=2e-2, atol=2e-2)


# ***** views *****
@check("views", "reshape permute expand")
def _movement(dev: str) -> None:
  x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  t = _T(x, dev)
  _close(t.reshape(6, 4).numpy(), x.reshape(6, 4), "reshape")
  _close(t.permute(2, 0, 1).numpy(), x.transpose(2, 0, 1), "permute")
  _close((t.permute(1, 0, 2) + 1).numpy(), x.transpose(1, 0, 2) + 1, "permute+1")
  _close(t[:, :1].expand(2, 5, 4).numpy(), np.broadcast_to(x[:, :1], (2, 5, 4)), "expand")


@check("views", "pad shrink flip")
def _pad_shrink(dev: str) -> None:
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  t = _T(x, dev)
  _close(t.pad(((1, 2), (0, 1))).numpy(), np.pad(x, ((1, 2), (0, 1))), "pad")
  _close(t.shrink(((1, 3), (2, 5))).numpy(), x[1:3, 2:5], "shrink")
  _close(t.flip(1).numpy(), x[:, ::-1], "flip")
  _close(t.pad(((0, 0), (2, 0))).shrink(((1, 4), (1, 6))).flip(0).numpy(), np.pad(x, ((0, 0), (2, 0)))[1:4, 1:6][::-1],
         "pad+shrink+flip")


@check("views", "slicing")
def _slicing(dev: str) -> None:
  x = np.arange(60, dtype=np.float32).reshape(5, 12)
  t = _T(x, dev)
  for what, got, want in (("[1:4]", t[1:4], x[1:4]), ("[:, ::3]", t[:, ::3], x[:, ::3]), ("[-1]", t[-1], x[-1]),
                          ("[2, 3:9]", t[2, 3:9], x[2, 3:9]), ("[::-2, 1]", t[::-2, 1], x[::-2, 1])):
    _close(got.numpy(), want, what)


@check("views", "views of realized buffers")
def _buffer_views(dev: str) -> None:
  """Contiguous slices of a realized buffer become views at an offset (SLICE): `_offset`, or a copy without it."""
  x = np.arange(64, dtype=np.float32)
  t = _T(x, dev).realize()
  v = t[8:40].contiguous().realize()
  _close(v.numpy(), x[8:40], "view at offset 32 bytes")
  _close((v * 2).numpy(), x[8:40] * 2, "kernel reading a view")
  w = t.reshape(8, 8)[3:5].contiguous().realize()
  _close((w + v[:16].reshape(2, 8)).numpy(), x.reshape(8, 8)[3:5] + x[8:24].reshape(2, 8), "two views")
  _close(t.numpy(), x, "base unchanged")


@check("views", "assign in place")
def _assign(dev: str) -> None:
  from tiny_tensor import Tensor
  t = Tensor.zeros(4, 3, device=dev).contiguous().realize()
  for i in range(3): t.assign(t + i).realize()
  _close(t.numpy(), np.full((4, 3), 3.0, np.float32), "t += i, three times")


# ***** copies *****
@check("copies", "host round trip")
def _roundtrip(dev: str) -> None:
  r = _rng(6)
  for n in (1, 3, 17, 1000, 4099):
    x = r.standard_normal(n).astype(np.float32)
    _close(_T(x, dev).numpy(), x, f"{n} floats")
  b = r.integers(0, 256, 13).astype(np.uint8)
  if _supports(dev, dtypes.uint8): _close(_T(b, dev).numpy(), b, "13 bytes")


@check("copies", "to and from another device")
def _cross_device(dev: str) -> None:
  other = _other_device(dev)
  x = _rng(7).standard_normal((5, 6)).astype(np.float32)
  t = _T(x, dev)
  o = t.to(other)
  assert o.device == other, f"to({other!r}) gave a tensor on {o.device}"
  _close(o.numpy(), x, f"{dev} -> {other}")
  back = (o * 3).to(dev)
  assert back.device == dev
  _close((back + t).numpy(), x * 3 + x, f"{other} -> {dev}, then a kernel on {dev}")


# ***** dtypes *****
DTYPES = (dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32,
          dtypes.int64, dtypes.uint32, dtypes.bool)


def _dtype_check(dt: DType) -> Callable[[str], None]:
  def fn(dev: str) -> None:
    if not _supports(dev, dt): raise NotApplicable(f"{dt.name} is not in the renderer's supported_dtypes()")
    npdt = to_numpy(dt)
    r = _rng(8)
    if dt == dtypes.bool: x = r.integers(0, 2, 24).astype(np.bool_)
    elif dtypes.is_float(dt): x = r.uniform(-4, 4, 24).astype(npdt)
    elif dtypes.is_unsigned(dt): x = r.integers(0, 100, 24).astype(npdt)
    else: x = r.integers(-50, 50, 24).astype(npdt)
    t = _T(x, dev)
    assert t.dtype == dt, f"Tensor of {npdt} has dtype {t.dtype}"
    _close(t.numpy(), x, "round trip")
    if dt == dtypes.bool:
      _close((t & ~t[::-1]).numpy(), x & ~x[::-1], "a & ~b")
    else:
      rtol = 1e-2 if dt == dtypes.float16 else 1e-6
      _close((t + t[::-1]).numpy(), (x + x[::-1]).astype(npdt), "a+b", rtol=rtol, atol=rtol)
      _close((t * 2).numpy(), (x * 2).astype(npdt), "a*2", rtol=rtol, atol=rtol)
      _close(t.max().numpy(), x.max(), "max")
    if _supports(dev, dtypes.float32):
      _close(t.cast(dtypes.float32).numpy(), x.astype(np.float32), f"cast {dt.name} -> float32")
      if dt != dtypes.bool:
        f = r.uniform(-40, 40, 24).astype(np.float32)
        if dtypes.is_unsigned(dt): f = np.abs(f)
        _close(_T(f, dev).cast(dt).numpy(), f.astype(npdt), f"cast float32 -> {dt.name}")
  return fn


for _dt in DTYPES: check("dtypes", np.dtype(to_numpy(_dt)).name)(_dtype_check(_dt))


# ***** jit *****
@check("jit", "capture and replay")
def _jit(dev: str) -> None:
  from tiny_tensor import TinyJit

  @TinyJit
  def f(a, b): return ((a @ b).relu() + 1).realize()

  r = _rng(9)
  for i in range(5):
    a, b = r.standard_normal((4, 8)).astype(np.float32), r.standard_normal((8, 3)).astype(np.float32)
    _close(f(_T(a, dev), _T(b, dev)).numpy(), np.maximum(a @ b, 0) + 1, f"call {i + 1}", rtol=1e-4, atol=1e-4)
  assert f.captured is not None, "TinyJit did not capture"


@check("jit", "symbolic variable")
def _jit_var(dev: str) -> None:
  from tiny_tensor import Tensor, TinyJit, Variable

  @TinyJit
  def f(a, n): return (a * n + 1).realize()

  for i in range(1, 5):
    x = _rng(10 + i).standard_normal(6).astype(np.float32)
    _close(f(_T(x, dev), Variable("n", 1, 10).bind(i)).numpy(), x * i + 1, f"n={i}", rtol=1e-6)
  assert isinstance(f(Tensor.zeros(6, device=dev).contiguous().realize(), Variable("n", 1, 10).bind(2)), Tensor)


# ***** graph *****
@check("graph", "device graph replay")
def _graph(dev: str) -> None:
  from tiny_tensor import TinyJit
  if Device[dev].graph is None: raise NotApplicable(f"{dev} has no graph class (Compiled.graph is None)")

  @TinyJit
  def f(a, b):
    h = (a * b).exp2()
    return ((h + a).sum(1) * 2 - b.max(1)).realize()

  r = _rng(11)
  for i in range(4):
    a, b = r.uniform(-1, 1, (5, 7)).astype(np.float32), r.uniform(-1, 1, (5, 7)).astype(np.float32)
    want = (np.exp2(a * b) + a).sum(1) * 2 - b.max(1)
    _close(f(_T(a, dev), _T(b, dev)).numpy(), want, f"call {i + 1}", rtol=1e-4, atol=1e-4)
  from tiny_tensor.jit import _GraphCall
  assert f.captured is not None and any(isinstance(c, _GraphCall) for c in f.captured.plan), \
    "the replay used no device graph"


@check("graph", "MLP forward and backward")
def _mlp(dev: str) -> None:
  r = _rng(12)
  x, w1, w2 = (r.standard_normal(s).astype(np.float32) * 0.5 for s in ((6, 5), (5, 8), (8, 3)))
  tx, tw1, tw2 = _T(x, dev), _T(w1, dev), _T(w2, dev)
  tw1.requires_grad = tw2.requires_grad = True
  h = (tx @ tw1).relu()
  loss = (h @ tw2).square().mean()
  loss.backward()
  # numpy: loss = mean((relu(x w1) w2)^2)
  hn = np.maximum(x @ w1, 0)
  y = hn @ w2
  dy = 2 * y / y.size
  dw2 = hn.T @ dy
  dw1 = x.T @ ((dy @ w2.T) * (x @ w1 > 0))
  _close(loss.numpy(), np.float32((y ** 2).mean()), "loss", rtol=1e-4, atol=1e-5)
  _close(tw2.grad.numpy(), dw2, "dloss/dw2", rtol=1e-4, atol=1e-5)
  _close(tw1.grad.numpy(), dw1, "dloss/dw1", rtol=1e-4, atol=1e-5)


# ***** running *****
def run(device: str, groups: list[str] | None = None, on_result: Callable[[Result], None] | None = None,
        verbose: bool = False) -> list[Result]:
  """Run the checks (all, or those of `groups`) on `device` (a DEV string: "CPU", "MOCK+AMD", "CPU:CLANG");
  `on_result` is called after each. The device must open: a DeviceUnavailableError or UnknownDeviceError says why."""
  bad = [g for g in groups or () if g not in GROUPS]
  if bad: raise ValueError(f"unknown check group(s) {', '.join(bad)}; valid: {', '.join(GROUPS)}")
  dev = Target.parse(device).name
  Device[dev]  # open it now: an unavailable device is one clear error, not a table of failures
  out: list[Result] = []
  for c in CHECKS:
    if groups and c.group not in groups: continue
    st = time.perf_counter()
    try:
      with Context(DEV=device): c.fn(dev)
      res = Result(c.group, c.name, "pass", time.perf_counter() - st)
    except NotApplicable as e:
      res = Result(c.group, c.name, "n/a", time.perf_counter() - st, str(e))
    except Exception as e:  # a failing check is reported, and the others still run
      detail = traceback.format_exc() if verbose else f"{type(e).__name__}: {e}"
      res = Result(c.group, c.name, "FAIL", time.perf_counter() - st, detail)
    out.append(res)
    if on_result is not None: on_result(res)
  return out


def format_table(results: list[Result]) -> str:
  """The results as a text table, then a summary line ("N passed, N failed, N n/a")."""
  rows = [("GROUP", "CHECK", "RESULT", "TIME", "DETAIL")]
  for r in results:
    detail = r.detail.strip().splitlines()
    rows.append((r.group, r.name, r.status, f"{r.seconds * 1e3:.0f} ms", detail[0] if detail else ""))
    rows.extend(("", "", "", "", line) for line in detail[1:])
  width = [max(len(row[i]) for row in rows) for i in range(4)]
  lines = ["  ".join(v.ljust(w) for v, w in zip(row[:4], width)) + "  " + row[4] for row in rows]
  n = {s: sum(r.status == s for r in results) for s in ("pass", "FAIL", "n/a")}
  lines.append(f"{n['pass']} passed, {n['FAIL']} failed, {n['n/a']} n/a")
  return "\n".join(line.rstrip() for line in lines)


def _timeit(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> float:
  fn()
  sync()
  st = time.perf_counter()
  for _ in range(reps): fn()
  sync()
  return (time.perf_counter() - st) / reps


def speed(device: str, n: int = 1024, copy_mb: int = 64, reps: int = 10,
          torch_device: str | None = None) -> dict[str, dict[str, float]]:
  """{row: {"tiny": value, "torch": value}}: GEMM n^3 TFLOPS (float16 where supported, and bfloat16), the
  GB/s of `s + 0` over `copy_mb` MB (read + write) and the host µs per TinyJit replay of a one-kernel function; torch's
  figures on `torch_device` when given and torch is installed."""
  from tiny_tensor import Tensor, TinyJit
  dev = Target.parse(device).name
  d = Device[dev]
  rows: dict[str, dict[str, float]] = {}
  gemm = [dt for dt in (dtypes.float16, dtypes.bfloat16) if dt == dtypes.bfloat16 or _supports(dev, dt)]
  for dt in gemm:
    a, b = Tensor.rand(n, n, device=dev).cast(dt).realize(), Tensor.rand(n, n, device=dev).cast(dt).realize()
    mm = TinyJit(lambda a, b: (a @ b).realize())
    t = _timeit(functools.partial(mm, a, b), d.synchronize, reps)
    rows[f"GEMM {n}^3 {_NAMES[dt]} TFLOPS"] = {"tiny": 2 * n ** 3 / t / 1e12}
  src = Tensor.rand(copy_mb << 18, device=dev).realize()
  cp = TinyJit(lambda s: (s + 0).realize())
  copy_row = f"copy {copy_mb} MB GB/s (read+write)"
  rows[copy_row] = {"tiny": 2 * src.nbytes() / _timeit(lambda: cp(src), d.synchronize, reps) / 1e9}
  x = Tensor.rand(16, device=dev).realize()
  f = TinyJit(lambda x: (x + 1).realize())
  for _ in range(3): f(x)
  d.synchronize()
  st = time.perf_counter()
  for _ in range(100): f(x)
  rows["TinyJit replay host us"] = {"tiny": (time.perf_counter() - st) / 100 * 1e6}
  d.synchronize()
  if torch_device is not None:
    try:
      import torch
    except ImportError: torch = None
    if torch is not None:
      sync = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
      for dt in gemm:
        ta, tb = (torch.rand(n, n, device=torch_device, dtype=getattr(torch, _NAMES[dt])) for _ in range(2))
        t = _timeit(functools.partial(operator.matmul, ta, tb), sync, reps)
        rows[f"GEMM {n}^3 {_NAMES[dt]} TFLOPS"]["torch"] = 2 * n ** 3 / t / 1e12
      ts = torch.rand(copy_mb << 18, device=torch_device)
      rows[copy_row]["torch"] = 2 * ts.numel() * 4 / _timeit(lambda: ts + 0, sync, reps) / 1e9
  return rows


def _register_plugin(spec: str) -> None:
  from tiny_uop.plugins import DevicePlugin, register_device
  name, sep, target = spec.partition("=")
  if not sep:
    raise ValueError(f"--plugin {spec!r}: expected NAME=module:Class, e.g. NV=tiny_runtime_nv.device:NVDevice")
  register_device(DevicePlugin(name.strip().upper(), target.strip()))


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m tiny_tensor.conformance",
                               description="Check a device against numpy: ops, views, copies, dtypes, JIT and graphs. "
                                           "Exit status 1 when a check fails.")
  ap.add_argument("--device", required=True, help="the device, as a DEV string: CPU, PYTHON, MOCK+AMD, CPU:CLANG, ...")
  ap.add_argument("--only", default="", help=f"comma-separated groups to run (default all): {','.join(GROUPS)}")
  ap.add_argument("--verbose", action="store_true", help="full tracebacks for failures")
  ap.add_argument("--speed", action="store_true", help="then print GEMM TFLOPS, copy GB/s and TinyJit replay us")
  ap.add_argument("--gemm", type=int, default=1024, help="--speed: the GEMM size n (n x n @ n x n; default 1024)")
  ap.add_argument("--copy-mb", type=int, default=64, help="--speed: MB copied (default 64)")
  ap.add_argument("--reps", type=int, default=10, help="--speed: timed repetitions (default 10)")
  ap.add_argument("--torch", default=None, metavar="DEVICE", help="--speed: torch's figures on this device (cuda)")
  ap.add_argument("--plugin", action="append", default=[], metavar="NAME=module:Class",
                  help="register a device class without installed entry points (repeatable)")
  args = ap.parse_args(argv)
  groups = [g.strip() for g in args.only.split(",") if g.strip()] or None
  from tiny_uop.plugins import DeviceUnavailableError, UnknownDeviceError
  try:
    for spec in args.plugin: _register_plugin(spec)
    results = run(args.device, groups, verbose=args.verbose)
  except (DeviceUnavailableError, UnknownDeviceError, ValueError) as e:
    print(f"conformance: {e}", file=sys.stderr)
    return 2
  print(f"tiny conformance: device {args.device}")
  print(format_table(results), flush=True)
  if args.speed:
    for k, r in speed(args.device, args.gemm, args.copy_mb, args.reps, args.torch).items():
      print(f"  {k:34s} " + "  ".join(f"{impl}={v:,.2f}" for impl, v in r.items()), flush=True)
  return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  raise SystemExit(run_main(main, "python -m tiny_tensor.conformance"))
