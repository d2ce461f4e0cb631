"""Regressions of issue #18 at the Tensor level: each item used to crash or give a silently wrong value; now it gives
the right value (checked against numpy/torch/the documented rule) or an error naming the bad value.

CPU programs run on both CPU renderers (LLVM, and C with the compiler `find_tool("cc")` finds: clang, gcc or
ziglang's `zig cc`, a test dependency).
"""
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tiny_uop import Ops, dtypes
from tiny_uop.dtype import float_to_int
from tiny_uop.helpers import Context
from tiny_uop.tools import find_tool
from tiny_tensor import Device, Tensor

NEEDS_CLANG = pytest.mark.skipif(find_tool("cc") is None, reason="CPU:CLANG: no C compiler (pip install ziglang)")
RENDERERS = ["LLVM", pytest.param("CLANG", marks=NEEDS_CLANG)]


# ***** casts on CPU: the documented rule (tiny_uop.dtype.float_to_int), as the PYTHON device computes it *****
CAST_VALS = [-3.7, 3.7, 1e10, -1e10, 300.0, -300.0, 1e19, 2.0**63, 2.0**64, math.inf, -math.inf, math.nan, -0.0,
             65504.0, 7e4, 1e-8]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]


@pytest.mark.parametrize("ren", RENDERERS)
@pytest.mark.parametrize("n", [1, 24])  # 24 copies: the LLVM expander casts native vectors
def test_float_to_int_casts_follow_the_rule(ren, n):
  with Context(DEV=f"CPU:{ren}"):
    for f in (dtypes.float64, dtypes.float32, dtypes.float16):
      src = Tensor(CAST_VALS * n, dtype=f, device="CPU")
      exact = [float(x) for x in src.numpy()[:len(CAST_VALS)]]  # the values once rounded to f
      for i in INTS:
        got = src.cast(i).tolist()[:len(CAST_VALS)]
        want = [float_to_int(x, i) for x in exact]
        assert got == want, (ren, f, i, [(v, g, w) for v, g, w in zip(exact, got, want) if g != w])
        assert Tensor(CAST_VALS, dtype=f, device="PYTHON").cast(i).tolist() == want


def test_float_to_uint64_documented_values():
  # -3.7 truncates to -3, which wraps to 2**64-3 (AVX-512's vcvttsd2usi gave 2**64-1); >= 2**63 goes through x - 2**63
  t = Tensor([-3.7, 1e19, 2.0**64, math.nan, -math.inf], dtype=dtypes.float64)
  want = [2**64 - 3, 10**19, 0, 2**63, 2**63]
  assert t.cast(dtypes.uint64).tolist() == want == t.to("PYTHON").cast(dtypes.uint64).tolist()
  assert Tensor([300.0, 1e10]).cast(dtypes.int8).tolist() == [44, 0]
  assert Tensor([1e10]).cast(dtypes.int32).item() == -2**31


def _near_midpoints(rng, dt):
  """float64 values a hair off the midpoints between neighbours of `dt`: rounding through float32 first lands on the
  midpoint and rounds it the wrong way (double rounding)."""
  import ml_dtypes
  np_dt = np.float16 if dt == dtypes.float16 else ml_dtypes.bfloat16
  base = rng.standard_normal(300).astype(np_dt)
  nxt = np.nextafter(base.astype(np.float32), np.float32(np.inf)).astype(np_dt)  # (bf16: via float32 is exact)
  nxt = np.where(nxt == base, (base.astype(np.float64) * (1 + 2.0 ** -6)).astype(np_dt), nxt)
  mid = (base.astype(np.float64) + nxt.astype(np.float64)) / 2
  eps = np.abs(mid) * 2.0 ** -40
  x = np.concatenate([mid + eps, mid - eps, [1e300, -1e300, 65520.0, 65519.99, 0.0, -0.0, 2.0 ** -30, math.nan]])
  with np.errstate(over="ignore"): return x, x.astype(np_dt).astype(np.float64)


@pytest.mark.parametrize("dev", ["CPU:LLVM", pytest.param("CPU:CLANG", marks=NEEDS_CLANG), "PYTHON"])
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_float64_to_half_and_bf16_round_once(dev, dt):
  """float64 -> half used to call __truncdfhf2: MCJIT left it unresolved (a jump to address 0), clang 14 returned
  garbage; float64 -> bfloat16 rounded twice (through float32). The reference is numpy / ml_dtypes."""
  x, want = _near_midpoints(np.random.default_rng(3), dt)
  with Context(DEV=dev):
    got = Tensor(x, dtype=dtypes.float64, device=dev.split(":")[0]).cast(dt).cast(dtypes.float64).numpy()
  bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
  assert not bad.any(), (x[bad][:4], got[bad][:4], want[bad][:4])


# ***** Python ints beyond int32 *****
def test_big_python_ints_pick_int64_or_refuse():
  assert Tensor([2**40]).dtype == dtypes.int64 and Tensor([2**40]).tolist() == [2**40]
  assert Tensor(2**40).dtype == dtypes.int64 and Tensor(2**40).item() == 2**40
  assert Tensor([1, 2**63]).dtype == dtypes.uint64 and Tensor([2**63]).item() == 2**63
  assert Tensor([[1], [-2**40]]).dtype == dtypes.int64
  with pytest.raises(ValueError, match=r"Python int 18446744073709551616 doesn't fit.*uint64 \[0, 2\*\*64-1\]"):
    Tensor([2**64])
  with pytest.raises(ValueError, match="-1 and 9223372036854775808 together"): Tensor([-1, 2**63])
  with pytest.raises(ValueError, match=r"Python int 1099511627776 is out of range for the tensor's dtype dtypes.int32"):
    Tensor([1]) + 2**40
  with pytest.raises(ValueError, match="out of range for the tensor's dtype dtypes.uint8"):
    Tensor([1], dtype=dtypes.uint8) * -1
  with pytest.raises(ValueError, match="full_like: Python int 1099511627776 is out of range for the tensor's dtype"):
    Tensor([1, 2]).full_like(2**40)
  assert Tensor([1, 2]).full_like(2**40, dtype=dtypes.int64).tolist() == [2**40] * 2
  assert Tensor.full((2,), 2**40).dtype == dtypes.int64 and (Tensor([1, 0]) > 0).where(2**40, 0).tolist() == [2**40, 0]
  assert (Tensor([1]).cast(dtypes.int64) + 2**40).tolist() == [2**40 + 1]
  assert (Tensor([2**31 - 1]) + 1).tolist() == [-2**31]  # arithmetic in the tensor's dtype wraps (the dtype wins)


def test_int_mean_accumulates_wider():
  for npdt in (np.int32, np.int16, np.uint32, np.int64):
    a = np.full(1000, np.iinfo(npdt).max // 2, npdt)
    got = Tensor(a).mean().item()
    assert got == pytest.approx(float(a.astype(np.float64).mean()), rel=1e-6), npdt
  assert Tensor(np.full(1000, 2**30, np.int32)).mean().item() == 2.0**30
  assert Tensor(np.full((3, 1000), 2**30, np.int32)).mean(1).tolist() == [2.0**30] * 3


def test_int_mod_and_div_by_zero_are_zero():
  a, b = np.array([7, -7, 5, 0], np.int32), np.array([0, 0, 3, 0], np.int32)
  with np.errstate(all="ignore"): want_mod, want_div = a % b, a // b
  assert (Tensor(a) % Tensor(b)).tolist() == want_mod.tolist() == [0, 0, 2, 0]
  assert (Tensor(a) // Tensor(b)).tolist() == want_div.tolist()
  assert (Tensor([7]) % 0).tolist() == [0] and (Tensor([7], device="PYTHON") % 0).tolist() == [0]
  f = (Tensor([7.0]) % 0).item()
  assert math.isnan(f)


# quotients far past 2**mantissa (the fuzzer's seed 33227: 1.8e19 % 0.7 was -3.5e11), subnormal and huge divisors
_EXTREMES = [1.8e19, -3e10, 3.4e38, -3.4e38, 1e-30, -1e-30, 1e-45, 1e-38, 6e4, 1e-7, 0.7, -0.3]


@pytest.mark.parametrize("npdt", [np.float64, np.float32, np.float16])
def test_float_floordiv_mod_fmod_match_numpy(npdt):
  """a - floor(a/b)*b gave NaN for an infinite divisor (numpy: 5 % inf = 5, -5 % inf = inf), 10 for 1 // 0.1 (9),
  cancelled in half precision, and was wrong once |a/b| passed 2**mantissa; `fmod` as a - trunc(a/b)*b likewise.
  Both now come from the IR's exact float CMOD (C's fmod; PTX and AMDGPU lower it to `exact_fmod`): bit-exact with
  numpy for every pair, on every device."""
  rng = np.random.default_rng(1)
  ext = np.array(_EXTREMES)
  a = np.concatenate([rng.standard_normal(300) * 100, [5, -5, 0, -0.0, 1, 1, np.inf, np.nan, 7, -7, 3, 1e4, -0.3],
                      np.repeat(ext, len(ext))])
  b = np.concatenate([rng.standard_normal(300) * 3, [np.inf, np.inf, -np.inf, 3, 0.1, 0, 2, 2, 0, -0.0, -np.inf, 1e-3,
                                                     0.1], np.tile(ext, len(ext))])
  with np.errstate(all="ignore"):
    A, B = a.astype(npdt), b.astype(npdt)  # 1e30 -> inf in half
    wq, wr, wf = np.floor_divide(A, B), np.mod(A, B), np.fmod(A, B)
  for dev in dict.fromkeys((Device.DEFAULT, "CPU", "PYTHON")):
    ta, tb = Tensor(A, device=dev), Tensor(B, device=dev)
    q, r, f = (ta // tb).numpy(), (ta % tb).numpy(), ta.fmod(tb).numpy()
    np.testing.assert_array_equal(q, wq, err_msg=f"{dev} //")
    np.testing.assert_array_equal(r, wr, err_msg=f"{dev} %")
    np.testing.assert_array_equal(f, wf, err_msg=f"{dev} fmod")
    for got, want in ((q, wq), (r, wr), (f, wf)):  # the signs of zeros too
      assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all(), dev
  assert (Tensor([1.0], dtype=dtypes.float64) // 0.1).item() == 1.0 // 0.1 == 9.0


@pytest.mark.dev_session("CPU")
@pytest.mark.parametrize("npdt", [np.float32, np.float64])
def test_exact_fmod_decomposition_on_random_bits(npdt):
  """The decomposition PTX and AMDGPU lower float CMOD with (`exact_fmod`: no fmod instruction of their own), run
  on the CPU through its LLVM renderer told it has no exact fmod: bit-exact with np.fmod for random bit patterns
  (every exponent pair: subnormals, quotients up to 2**2098, inf, NaN) and the kernel has no `frem` left."""
  from tiny_codegen import get_program
  from tiny_uop.plugins import Device
  ut = np.uint32 if npdt == np.float32 else np.uint64
  rng = np.random.default_rng(33227)
  x, y = (rng.integers(0, np.iinfo(ut).max, 4099, dtype=ut, endpoint=True).view(npdt) for _ in range(2))
  fi = np.finfo(npdt)  # and the widest quotients: the largest x over the smallest subnormals, every sign
  big = np.array([fi.max, -fi.max, fi.max * 0.75, fi.max / 3, np.inf], npdt)
  full = fi.smallest_normal - fi.smallest_subnormal  # the largest subnormal: every mantissa bit set
  tiny = np.array([fi.smallest_subnormal, -fi.smallest_subnormal * 3, full, -full * 0.6, fi.smallest_normal * 1.7,
                   0.0], npdt)
  x, y = np.concatenate([x, np.repeat(big, len(tiny))]), np.concatenate([y, np.tile(tiny, len(big))])
  dev = Device["CPU"]
  plain = dev.renderer
  no_fmod = type(f"NoFmod{type(plain).__name__}", (type(plain),), {"exact_fmod": False})(plain.arch)
  try:
    dev.renderer = no_fmod
    out = Tensor(x, device="CPU").fmod(Tensor(y, device="CPU"))
    srcs = [get_program(c.src[0], no_fmod).src for c in out.schedule().calls if c.src[0].op is Ops.SINK]
    got = out.numpy()
  finally:
    dev.renderer = plain
  assert srcs and not any("frem" in src for src in srcs) and any("llvm.fma" in src for src in srcs)
  with np.errstate(all="ignore"): want = np.fmod(x, y)
  np.testing.assert_array_equal(got, want)
  assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()


def test_float_mod_fmod_gradients_match_torch():
  a, b = np.array([5.5, -3.0, 7.25, -1e3], np.float32), np.array([2.0, 2.0, -0.5, 0.7], np.float32)
  for name in ("remainder", "fmod"):
    t, u = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    (t % u if name == "remainder" else t.fmod(u)).sum().backward()
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    getattr(torch, name)(ta, tb).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), ta.grad.numpy(), err_msg=name)
    np.testing.assert_allclose(u.grad.numpy(), tb.grad.numpy(), err_msg=name)


def test_abs_sign_of_infinities():
  x = np.array([np.inf, -np.inf, -2.5, 0.0, -0.0, np.nan], np.float32)
  with Context(DEV="CPU"):
    np.testing.assert_array_equal(Tensor(x).abs().numpy(), np.abs(x))
    np.testing.assert_array_equal(Tensor(x).sign().numpy(), np.sign(x))
  np.testing.assert_array_equal(Tensor(x, device="PYTHON").abs().numpy(), np.abs(x))
  # gradients stay those of |x| and sign
  t = Tensor(np.array([3.0, -2.0, np.inf], np.float32), requires_grad=True)
  t.abs().sum().backward()
  assert t.grad.tolist() == [1.0, -1.0, 1.0]


@pytest.mark.parametrize("data", [[1.0, np.nan, 3.0, np.nan], [np.nan, 5.0], [2.0, 7.0, -np.inf, 7.0]])
def test_argmax_argmin_with_nan(data):
  a = np.array(data, np.float32)
  assert Tensor(a).argmax().item() == np.argmax(a) and Tensor(a).argmin().item() == np.argmin(a)
  m = np.stack([a, a[::-1]])
  assert Tensor(m).argmax(1).tolist() == np.argmax(m, 1).tolist()
  assert Tensor(m).argmin(1).tolist() == np.argmin(m, 1).tolist()


def test_topk_and_sort_with_nan_and_duplicates():
  a = np.array([3.0, np.nan, 1.0, 2.0, 3.0, -0.0, 0.0, np.nan], np.float32)
  v, i = Tensor(a).sort()
  np.testing.assert_array_equal(v.numpy(), np.sort(a))  # NaNs last, as numpy
  assert sorted(i.tolist()) == list(range(len(a)))  # a permutation: no index twice
  np.testing.assert_array_equal(a[i.numpy()], np.sort(a))
  tv, ti = torch.tensor(a).topk(4)
  v, i = Tensor(a).topk(4)
  np.testing.assert_array_equal(v.numpy(), tv.numpy())  # NaN ranks highest, as torch
  assert len(set(i.tolist())) == 4 and np.array_equal(a[i.numpy()], tv.numpy(), equal_nan=True)
  v, i = Tensor(a).topk(3, largest=False)
  assert v.tolist() == [-0.0, 0.0, 1.0] and len(set(i.tolist())) == 3
  h = Tensor(a.astype(np.float16)).sort()[0].numpy()
  np.testing.assert_array_equal(h, np.sort(a.astype(np.float16)))


def test_reshape_needs_int_dims():
  t = Tensor.ones(6)
  with pytest.raises(TypeError, match=r"reshape \(2.0, 3\): dimension 2.0 is a float; valid: ints"): t.reshape(2.0, 3)
  with pytest.raises(TypeError, match="dimension True is a bool"): t.reshape(True, 6)
  assert t.reshape(np.int64(2), 3).shape == (2, 3) and t.reshape((3, -1)).shape == (3, 2)


def test_cos_at_large_arguments():
  """On the CPU (libm's sin), PYTHON and the session's device (a GPU renderer's own sin, Payne-Hanek reduced: accurate
  at any argument too, tiny_codegen.lower.transcendental)."""
  x = np.array([3e7, 1e5, -7e6, 1.5707964, np.pi, 0.0, -0.5, 1.0, 2.0, 1e-20, 3e38, np.inf, np.nan], np.float32)
  with np.errstate(invalid="ignore"): want = np.cos(x.astype(np.float64))
  for dev in dict.fromkeys(("CPU", "PYTHON", Device.DEFAULT)):
    got = Tensor(x, device=dev).cos().numpy().astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=2e-8)
  for dev in dict.fromkeys(("CPU", Device.DEFAULT)):
    assert Tensor([3e7], device=dev).cos().item() == pytest.approx(-0.2654294, abs=1e-6)
    x64 = np.array([3e7, 1e15, 12345.678], np.float64)
    np.testing.assert_allclose(Tensor(x64, device=dev).cos().numpy(), np.cos(x64), rtol=1e-13)
    h = np.array([1000.0, 30000.0, 3.0], np.float16)
    np.testing.assert_allclose(Tensor(h, device=dev).cos().numpy().astype(np.float64), np.cos(h.astype(np.float64)),
                               atol=1e-3)
    # the gradient is -sin(x), also where sin(2x)/(2 sin x) would cancel
    xs = np.array([0.0, np.pi, 3e7, 0.3], np.float32)
    t = Tensor(xs, requires_grad=True, device=dev)
    t.cos().sum().backward()
    tt = torch.tensor(xs, requires_grad=True)
    tt.cos().sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-5, atol=1e-6)
    s, ts = Tensor(xs, requires_grad=True, device=dev), torch.tensor(xs, requires_grad=True)
    s.sin().sum().backward()  # sin's gradient is this cos too
    ts.sin().sum().backward()
    np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert (Tensor(xs, device=dev).tan().numpy() == pytest.approx(np.tan(xs.astype(np.float64)), rel=1e-4))


# ***** DEV strings *****
def _run(code: str, dev: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                        env={**__import__("os").environ, "DEV": dev})


def test_dev_mock_cpu_is_rejected_and_renderers_listed():
  with Context(DEV="MOCK+CPU"):
    from tiny_uop.plugins import Device, DeviceUnavailableError
    with pytest.raises(DeviceUnavailableError, match=r"MOCK\+CPU: unknown interface 'MOCK' for CPU; valid: none"):
      Tensor([1.0]).realize()
  Device._forget("CPU")
  with Context(DEV="CPU:FOO"):
    with pytest.raises(ValueError, match=r"device CPU has no renderer 'FOO'; its renderers: LLVM, CLANG"):
      (Tensor([1.0]) + 1).realize()
  r = _run("from tiny_tensor import Tensor; print((Tensor([1])+1).tolist())", "MOCK+PYTHON")
  assert r.returncode != 0 and "unknown interface 'MOCK' for PYTHON" in r.stderr


# ***** CHECK_OOB *****
def _oob_kernel(n_out: int, n_in: int, shift: int, name: str):
  from tiny_uop.uop import KernelInfo, Ops, UOp
  out = UOp(Ops.PARAM, dtypes.float32.ptr(n_out), arg=0)
  inp = UOp(Ops.PARAM, dtypes.float32.ptr(n_in), arg=1)
  r = UOp.range(n_out, 0)
  return UOp.sink(out.index(r).store(inp.index(r + shift).load() * 2.0).end(r), arg=KernelInfo(name))


def _launch(ast, a: np.ndarray, n_out: int):
  from tiny_codegen import get_program
  from tiny_uop.device import Buffer
  from tiny_uop.plugins import Device
  dev = Device["CPU"]
  spec = get_program(ast, dev.renderer)
  prg = dev.get_program(spec.name, spec.lib)
  o = Buffer("CPU", n_out, dtypes.float32).ensure_allocated()
  i = Buffer("CPU", a.size, dtypes.float32).ensure_allocated()
  i.copyin(memoryview(a.tobytes()))
  try: prg(o._buf, i._buf, global_size=spec.global_size, local_size=spec.local_size, vals=())
  finally:
    res = bytearray(n_out * 4)
    o.copyout(memoryview(res))
  return np.frombuffer(res, np.float32), prg


@pytest.mark.parametrize("ren", RENDERERS)
@pytest.mark.parametrize("n", [5, 64])  # scalar and vectorized loads
def test_check_oob_names_kernel_buffer_index_size(ren, n):
  a = np.arange(n, dtype=np.float32)
  with Context(DEV=f"CPU:{ren}", CHECK_OOB=1):
    from tiny_runtime_cpu.cpu import OutOfBoundsError
    with pytest.raises(OutOfBoundsError, match=rf"CHECK_OOB: kernel 'oob_{ren}_{n}' read element (\d+) of buffer "
                                               rf"data1, which holds {n} elements \(valid: 0..{n - 1}\)") as e:
      _launch(_oob_kernel(n, n, 3, f"oob_{ren}_{n}"), a, n)
    assert n <= int(e.value.args[0].split("element ")[1].split()[0]) < n + 3
    got, prg = _launch(_oob_kernel(n, n, 0, f"inb_{ren}_{n}"), a, n)  # in bounds: no error, right values
    np.testing.assert_array_equal(got, a * 2)


def test_check_oob_without_the_flag_has_no_checks():
  from tiny_codegen import get_program
  from tiny_uop.plugins import Device
  with Context(DEV="CPU:LLVM", CHECK_OOB=0):
    src = get_program(_oob_kernel(8, 8, 0, "nocheck_k"), Device["CPU"].renderer).src
  assert "_oob" not in src
  with Context(DEV="CPU:LLVM", CHECK_OOB=1):
    src = get_program(_oob_kernel(8, 8, 0, "check_k"), Device["CPU"].renderer).src
  assert "@check_k_oob = global [4 x i64]" in src


def test_check_oob_tensor_programs_have_no_false_alarms():
  """Real Tensor programs (padding, gathers, reductions, matmul, conv) compiled with the checks run clean."""
  rng = np.random.default_rng(0)
  a, w = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  with Context(CHECK_OOB=1):
    t = Tensor(a)
    out = t.conv2d(Tensor(w), padding=1).relu().max_pool2d() + t.sum() / 7
    mm = Tensor(a.reshape(6, 81)) @ Tensor(a.reshape(81, 6))
    idx = t.flatten()[Tensor([0, 5, 485])]
    got = (out.sum().item(), mm.numpy(), idx.tolist(), t.pad(((0, 0), (1, 1), (2, 0), (0, 3))).cumsum(2).sum().item())
  with Context(CHECK_OOB=0):
    t = Tensor(a)
    want = ((t.conv2d(Tensor(w), padding=1).relu().max_pool2d() + t.sum() / 7).sum().item(),
            (Tensor(a.reshape(6, 81)) @ Tensor(a.reshape(81, 6))).numpy(), t.flatten()[Tensor([0, 5, 485])].tolist(),
            t.pad(((0, 0), (1, 1), (2, 0), (0, 3))).cumsum(2).sum().item())
  assert got[0] == pytest.approx(want[0], rel=1e-5) and got[2] == want[2] and got[3] == pytest.approx(want[3], rel=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
