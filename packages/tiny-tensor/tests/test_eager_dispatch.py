"""Eager dispatch cost cuts (issue #39, the small op and graph building): what each cut could break, checked against
independent references (numpy, torch, tinygrad 0.14's rules)."""
import numpy as np
import pytest

from tiny_tensor import Context, GlobalCounters, Tensor, dtypes, engine
from tiny_uop.helpers import NOOPT, ContextVar


def _x(seed: int, shape=(16, 16)) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_every_flag_write_moves_the_version_and_the_codegen_flags_follow_it():
  # `_codegen_flags()` is kept while ContextVar.version stands still: every write of a flag's value (a Context, or a
  # direct `.value =`) must move it, and the next call must read the new values
  old = NOOPT.value
  v0 = ContextVar.version
  try:
    NOOPT.value = 1  # a direct write, no Context
    assert ContextVar.version != v0
    assert engine._codegen_flags()[0] == 1
    v1 = ContextVar.version
    NOOPT.value = 1  # the same value written again still moves it (a write is a write)
    assert ContextVar.version != v1
    with Context(NOOPT=0):
      assert engine._codegen_flags()[0] == 0
    assert engine._codegen_flags()[0] == 1
  finally:
    NOOPT.value = old
  assert engine._codegen_flags()[0] == old


def test_a_direct_flag_write_takes_effect_at_the_next_replay():
  # a replay recorded under the default flags, then NOOPT set by a direct `.value =` (not a Context): the next
  # realize must launch the NOOPT program, as a compile under NOOPT gives it, with numbers against numpy
  from tiny_codegen import get_program
  from tiny_uop import Ops
  from tiny_uop.plugins import Device
  x, y = _x(1, (24, 24)), _x(2, (24, 24))
  a, b = Tensor(x), Tensor(y)
  f = lambda: (a @ b).realize()  # noqa: E731
  for _ in range(3): np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)  # recorded, replayed
  ast = next(c.src[0] for c in engine.plan([(a @ b).uop]).calls if c.src[0].op is Ops.SINK)
  renderer = Device[a.device].renderer
  old = NOOPT.value
  try:
    NOOPT.value = 1
    want = get_program(ast, renderer).src
    calls: list = []
    with engine.capture(calls.append): out = f()
    assert calls[0].spec.src == want
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4, atol=1e-4)
    for _ in range(2): np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)
  finally:
    NOOPT.value = old
  calls = []
  with engine.capture(calls.append): f()
  assert calls[0].spec.src == get_program(ast, renderer).src != want


def test_cached_ops_of_other_constants_dtypes_shapes_and_strides_each_run_their_own_kernel():
  # one loop interleaving ops of one structure that differ in the constant, the dtype, the shape or the strides:
  # every result against numpy, every round (the second and third rounds replay)
  x = _x(3, (8, 16))
  xi = (np.arange(128).reshape(8, 16) - 50).astype(np.int32)
  a, ai, ah = Tensor(x).realize(), Tensor(xi).realize(), Tensor(x.astype(np.float16)).realize()
  a2 = Tensor(x.reshape(16, 8)).realize()
  ops = [(lambda: a + 1, x + 1), (lambda: a + 2.5, x + 2.5), (lambda: ai + 1, xi + 1), (lambda: ai * 3, xi * 3),
         (lambda: ah + 1, (x.astype(np.float16) + np.float16(1))), (lambda: a2 + 1, x.reshape(16, 8) + 1),
         (lambda: a.T + 1, x.T + 1), (lambda: a[::2] + 1, x[::2] + 1), (lambda: a[:, 1:5] * 2, x[:, 1:5] * 2),
         (lambda: a.reshape(128) - 1, x.reshape(128) - 1), (lambda: a.cast(dtypes.int32), x.astype(np.int32))]
  for _ in range(3):
    for build, want in ops:
      got = build().realize().numpy()
      assert got.dtype == want.dtype and got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-3 if want.dtype == np.float16 else 1e-6)


def test_replayed_results_free_their_buffers_and_keep_the_graph_for_gradients():
  # the eager path moves a result's registry entry from the lazy to the origin registry: results dropped free their
  # memory, results kept still give torch's gradients
  torch = pytest.importorskip("torch")
  x = _x(4, (32, 32))
  a = Tensor(x).realize()
  for _ in range(3): (a + 1).realize()
  base = GlobalCounters.mem_used
  for _ in range(50): (a * 2 + 1).realize()
  assert GlobalCounters.mem_used == base  # every dropped result's buffer freed
  for _ in range(2):
    w = Tensor(x, requires_grad=True)
    h = (w * 3).realize()
    y = (h + 1).exp().realize()
    y.sum().backward()
    tw = torch.tensor(x, requires_grad=True)
    ((tw * 3 + 1).exp()).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)


@pytest.mark.parametrize("ra,rb", [(None, None), (True, None), (None, True), (False, None), (None, False),
                                   (False, False), (True, False), (False, True)])
def test_an_ops_requires_grad_follows_its_operands(ra, rb):
  # `_wrap`'s rule for an op's result: True if an operand's is (torch's rule), else None if one's is None (the
  # documented default: `Tensor.requires_grad`), else False; torch for every combination of True and False
  torch = pytest.importorskip("torch")
  x, y = _x(5, (4, 4)), _x(6, (4, 4))
  a, b = Tensor(x, requires_grad=ra), Tensor(y, requires_grad=rb)
  want = True if (ra or rb) else (None if None in (ra, rb) else False)
  if None not in (ra, rb):
    want = torch.tensor(x, requires_grad=ra).mul(torch.tensor(y, requires_grad=rb)).requires_grad
  assert (a * b).requires_grad == want and (a - b).requires_grad == want
  assert (a > 0).where(a, b).requires_grad == want
  assert a.reshape(16).requires_grad == (bool(ra) if ra is not None else None)


def test_reshapes_give_numpys_shapes_and_values_and_refuse_bad_shapes():
  x = _x(7, (6, 4))
  a = Tensor(x)
  for shape in [(24,), (4, 6), (2, 3, 4), (6, 4), (1, 24), (24, 1, 1), (4, -1), (-1,), (np.int64(12), 2)]:
    np.testing.assert_array_equal(a.reshape(shape).numpy(), x.reshape(tuple(int(s) for s in shape)))
  assert a.reshape(6, 4) is a and a.reshape((6, 4)) is a  # the same shape: the tensor itself
  assert a.reshape(None, 4).shape == (6, 4)
  with pytest.raises(ValueError, match="shape mismatch"): a.reshape(5, 5)
  with pytest.raises(ValueError, match="shape mismatch"): a.reshape(25)
  with pytest.raises(TypeError, match="bool"): a.reshape(True, 24)
  with pytest.raises(ValueError, match="negative"): a.reshape(-2, -12)
  with pytest.raises(TypeError, match="float"): a.reshape(24.0)
  e = Tensor(np.zeros((0, 4), np.float32))
  assert e.reshape(4, 0).shape == (4, 0)
  with pytest.raises(ValueError, match="shape mismatch"): e.reshape(1, 4)


def test_same_shape_ops_broadcast_nothing_and_mixed_shapes_still_broadcast():
  x, y, z = _x(8, (3, 4)), _x(9, (3, 4)), _x(10, (4,))
  a, b, c = Tensor(x), Tensor(y), Tensor(z)
  np.testing.assert_allclose((a + b).numpy(), x + y, rtol=1e-6)
  np.testing.assert_allclose((a * c).numpy(), x * z, rtol=1e-6)
  np.testing.assert_allclose((c - a).numpy(), z - x, rtol=1e-6)
  ai = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
  np.testing.assert_allclose((ai + a).numpy(), np.arange(12, dtype=np.int32).reshape(3, 4) + x, rtol=1e-6)
  np.testing.assert_allclose((a > 0).where(b, c).numpy(), np.where(x > 0, y, z), rtol=1e-6)
  with pytest.raises(Exception, match="broadcast"): a + Tensor(np.zeros((3, 5), np.float32))


def test_reflected_and_mixed_scalar_ops_replay_numpys_numbers():
  # `+`/`*` go to `_binop` directly and intern through `_INTERN`: reflected operands, bool/int/float constants and an
  # int tensor with a float constant (promoted: not the hot path) keep numpy's values and dtypes on every round
  x = _x(11, (6, 10))
  xi = (np.arange(60).reshape(6, 10) - 30).astype(np.int32)
  a, ai = Tensor(x).realize(), Tensor(xi).realize()
  ops = [(lambda: 1 + a, 1 + x), (lambda: 2.5 * a, 2.5 * x), (lambda: a + True, x + np.float32(1)),
         (lambda: 3 * ai, 3 * xi), (lambda: 7 + ai, 7 + xi), (lambda: ai * 0.5, xi.astype(np.float32) * 0.5),
         (lambda: ai + 1.5, xi.astype(np.float32) + 1.5), (lambda: a * -1, -x), (lambda: -2 + a * 3, x * 3 - 2),
         (lambda: ai + True, xi + 1), (lambda: False * ai, xi * 0)]
  for _ in range(3):
    for build, want in ops:
      got = build().realize().numpy()
      assert got.dtype == want.dtype and got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-6)


def test_replayed_cpu_kernels_of_one_to_four_buffers_read_each_calls_inputs():
  # the CPU launcher passes 1-3 buffers' addresses by name (4 and more: the general path): every replay of a kernel
  # of each width reads the buffers of this call (new tensors each round), against numpy
  rng = np.random.default_rng(12)
  for r in range(3):
    xs = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(3)]
    a, b, c = (Tensor(x).realize() for x in xs)
    np.testing.assert_array_equal(Tensor.full((5, 7), float(r)).contiguous().realize().numpy(),
                                  np.full((5, 7), r, np.float32))  # one buffer: the output alone
    np.testing.assert_allclose((a + r).realize().numpy(), xs[0] + r, rtol=1e-6)  # two
    np.testing.assert_allclose((a * b).realize().numpy(), xs[0] * xs[1], rtol=1e-6)  # three
    np.testing.assert_allclose((a * b + c).realize().numpy(), xs[0] * xs[1] + xs[2], rtol=1e-6)  # four


def test_a_replay_checked_once_per_flag_version_still_sees_a_closed_device(monkeypatch):
  # a record checked at this ContextVar.version skips its renderer and flag checks, never the device check: a device
  # closed (dropped from the opened table) makes the next realize schedule again, on the device opened anew
  from tiny_uop.plugins import Device
  x = _x(13, (4, 6))
  a = Tensor(x).realize()
  for _ in range(3): (a + 4).realize()
  opened = dict(Device._opened)
  monkeypatch.setattr(Device, "_opened", {})  # as if every device had been closed: replays must not run
  ran = []
  real = engine._launch
  monkeypatch.setattr(engine, "_launch", lambda *args: ran.append(1) or real(*args))
  assert engine._replay_launch(((a + 4).uop,)) is None and not ran
  monkeypatch.setattr(Device, "_opened", opened)
  for _ in range(2): np.testing.assert_allclose((a + 4).realize().numpy(), x + 4, rtol=1e-6)


def test_global_counters_count_replays_and_take_writes_as_class_attributes():
  # the counters live in one list the engine adds to (no class attribute writes on the hot path); read and written
  # as class attributes, as tinygrad's GlobalCounters: a cached 64x64 float32 add is 4096 FLOPs, 2 x 16384 bytes
  a = Tensor(_x(14, (64, 64))).realize()
  for _ in range(2): (a + 1).realize()
  GlobalCounters.reset()
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)
  assert GlobalCounters.time_sum_s == 0.0
  outs = [(a + 1).realize() for _ in range(3)]
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (3, 3 * 4096,
                                                                                                3 * 2 * 16384)
  assert GlobalCounters.time_sum_s > 0
  GlobalCounters.kernel_count += 5  # what TinyJit's replay does
  assert GlobalCounters.kernel_count == 8
  used = GlobalCounters.mem_used
  GlobalCounters.reset()
  assert GlobalCounters.mem_used == used and GlobalCounters.kernel_count == 0  # mem_used is not reset
  del outs
  assert GlobalCounters.mem_used == used - 3 * 16384  # the three results' buffers freed
