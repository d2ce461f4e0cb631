"""The engine: realize, kernel counts, program cache, becomes, buffer registry, GlobalCounters and DEBUG output."""
import gc

import numpy as np
import pytest

from tiny_tensor import Context, Device, GlobalCounters, Tensor, dtypes, engine
from tiny_uop import Ops


def test_realize_is_lazy_until_asked():
  a = Tensor([1.0, 2.0, 3.0])
  b = (a + 1) * 2
  assert b.uop.op is Ops.MUL and not engine.is_realized(b.uop)
  GlobalCounters.reset()
  b.realize()
  assert engine.is_realized(b.uop) and GlobalCounters.kernel_count == 1
  assert b.tolist() == [4.0, 6.0, 8.0] and GlobalCounters.kernel_count == 1  # already realized: no new kernel


def test_elementwise_chain_fuses_into_one_kernel():
  a, b = Tensor(np.ones((16, 16), np.float32)), Tensor(np.ones((16, 16), np.float32))
  GlobalCounters.reset()
  ((a + b) * 3 - a).exp().realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_mem > 0 and GlobalCounters.time_sum_s > 0


def test_constants_fold_into_consumer():
  a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  GlobalCounters.reset()
  out = (a + Tensor.arange(3).float() + Tensor.ones(2, 3)).realize()
  assert GlobalCounters.kernel_count == 1
  assert out.tolist() == [[1.0, 3.0, 5.0], [4.0, 6.0, 8.0]]


def test_realize_many_and_becomes_applies_to_every_live_tensor():
  a = Tensor([1.0, 2.0])
  x, y = a + 1, a * 3
  x2 = Tensor(x.uop)  # a second tensor on the same graph node
  Tensor.realize(x, y)
  assert engine.is_realized(x.uop) and engine.is_realized(y.uop) and x2.uop is x.uop
  assert x2.tolist() == [2.0, 3.0] and y.tolist() == [3.0, 6.0]


def test_program_cache_reused():
  a = Tensor(np.ones((8, 8), np.float32))
  (a + 1).realize()
  n = len(engine._program_cache)
  (a + 1).realize()
  (Tensor(np.zeros((8, 8), np.float32)) + 1).realize()
  assert len(engine._program_cache) == n


def test_buffers_freed_when_tensors_die():
  gc.collect()
  gc.disable()  # no collection of other tests' garbage in between the measurements
  try:
    before = GlobalCounters.mem_used
    t = Tensor(np.ones(1 << 16, np.float32))
    assert GlobalCounters.mem_used == before + (1 << 18)
    buf = engine.buffer_view(t.uop)[0]
    assert engine.get_buffer(buf).numpy().sum() == 1 << 16
    del t, buf
    assert GlobalCounters.mem_used == before  # freed by reference counting, no collection needed
  finally: gc.enable()


def test_assign_writes_into_the_same_buffer():
  t = Tensor(np.zeros(4, np.float32))
  buf = engine.buffer_view(t.uop)[0]
  t.assign(t + 2).realize()
  assert engine.buffer_view(t.uop)[0] is buf and engine.get_buffer(buf).numpy().tolist() == [2.0] * 4
  t[1:3] = 5.0
  assert engine.get_buffer(buf).numpy().tolist() == [2.0, 5.0, 5.0, 2.0]


def test_debug2_prints_a_line_per_kernel(capsys):
  a = Tensor(np.ones(32, np.float32))
  with Context(DEBUG=2): (a * 2 + 7).realize()
  lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("***")]
  assert len(lines) == 1 and "GFLOPS" in lines[0] and "us" in lines[0]


def test_global_counters_reset():
  (Tensor([1.0]) + 1).realize()
  GlobalCounters.reset()
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem,
    GlobalCounters.time_sum_s) \
    == (0, 0, 0, 0.0)


def test_reduce_then_elementwise_and_dtypes_end_to_end():
  x = np.random.default_rng(0).standard_normal((32, 17)).astype(np.float32)
  t = Tensor(x)
  out = (t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-5)
  ref = (x - x.mean(1, keepdims=True)) / (x.std(1, ddof=1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(out.numpy(), ref, atol=1e-5)
  assert Tensor(x).cast(dtypes.half).sum().dtype == dtypes.half


def _other_device() -> str:
  """A device other than the default one, present everywhere (PYTHON, or CPU when PYTHON is the default)."""
  return "CPU" if Device.DEFAULT == "PYTHON" else "PYTHON"


def test_copy_between_devices_and_its_gradient():
  home, other = Device.DEFAULT, _other_device()
  a = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  assert a.device == home
  b = a.to(other)
  assert b.device == other and b.uop.op is Ops.COPY
  c = (b * 2).to(home) + a
  assert c.device == home and c.tolist() == [3.0, 6.0, 9.0]
  c.sum().backward()
  assert a.grad.device == home and a.grad.tolist() == [3.0, 3.0, 3.0]
  assert Tensor([4.0, 5.0], device=other).sum().item() == 9.0


def test_bound_variables_as_values_and_shapes():
  from tiny_tensor import Variable
  v = Variable("n", 1, 10)
  a = Tensor(np.arange(10, dtype=np.float32))
  GlobalCounters.reset()
  for k in (3, 5, 7):
    assert (a[:4] * Tensor(v.bind(k))).tolist() == [0.0, k, 2.0 * k, 3.0 * k]
    assert a.shrink(((0, v.bind(k)),)).sum().item() == sum(range(k))
  assert Tensor(v.bind(2)).shape == () and Tensor(v.bind(2)).device == Device.DEFAULT
  for k in (2, 4):  # symbolic shapes through creation and reductions (mean divides by the bound size)
    assert (Tensor.ones(v.bind(k), 3) * 2).sum().item() == 6 * k
    assert a.shrink(((0, v.bind(k)),)).mean().item() == (k - 1) / 2


def test_global_ops_counts_flops():
  a, b = Tensor(np.ones((16, 8), np.float32)), Tensor(np.ones((8, 4), np.float32))
  GlobalCounters.reset()
  out = (a @ b).realize()
  assert out.numpy().sum() == 16 * 4 * 8
  assert GlobalCounters.global_ops == 2 * 16 * 8 * 4  # a multiply and an accumulate per (i, j, k)
  GlobalCounters.reset()
  (a + 1).realize()
  assert GlobalCounters.global_ops == 16 * 8 and GlobalCounters.global_mem == 2 * 16 * 8 * 4


def test_slice_of_a_buffer_is_a_zero_copy_view():
  a = Tensor(np.arange(10, dtype=np.float32))
  GlobalCounters.reset()
  s = a[3:7].contiguous().realize()
  assert GlobalCounters.kernel_count == 0 and s.tolist() == [3.0, 4.0, 5.0, 6.0]
  view, base = engine.get_buffer(engine.buffer_view(s.uop)[0]), engine.get_buffer(engine.buffer_view(a.uop)[0])
  assert view.base is base and view.offset == 3 * 4


def test_lazy_tensors_reuse_what_was_realized():
  x = Tensor(np.ones((8, 8), np.float32))
  h = x @ x
  y = h + 1
  h.realize()
  assert not engine.is_realized(y.uop) and engine.buffer_view(h.uop)[0] in y.uop.toposort()  # y now reads h's buffer
  GlobalCounters.reset()
  assert y.numpy()[0, 0] == 9.0
  assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_ops == 64  # only the +1, the matmul is not redone


def test_large_arange_is_linear_cost():
  GlobalCounters.reset()
  a = Tensor.arange(100_003)
  assert np.array_equal(a.numpy(), np.arange(100_003))
  assert GlobalCounters.global_ops < 20 * 100_003  # no n^2 triangle: [1..n] is built from two ~sqrt(n) ones


def test_realize_visits_only_lazy_tensors():
  from tiny_tensor import tensor as tmod
  keep = [Tensor(np.ones(2, np.float32)) for _ in range(100)]  # realized at creation: never visited by realize
  lazy = keep[0] + 1
  assert not any(id(k) in tmod._lazy_tensors for k in keep) and id(lazy) in tmod._lazy_tensors
  lazy.realize()
  (keep[1] * 2).realize()  # the next realize drops tensors that became buffers
  assert id(lazy) not in tmod._lazy_tensors and lazy.tolist() == [2.0, 2.0]


def test_cpu_and_python_devices_agree():
  # the PYTHON device interprets the kernels with the reference semantics: the same graphs must give the same numbers
  x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
  def run(dev):
    t = Tensor(x, device=dev)
    Tensor.manual_seed(11)
    return [((t * 2 + 1).exp2() - t.abs().sqrt()).numpy(), t.sum(1).numpy(), (t @ t.T).numpy(),
            t[Tensor([4, 0], device=dev), 1:5:2].numpy(), t.softmax().numpy(), t.argmax(0).numpy(),
            Tensor.rand(7, device=dev).numpy(), (Tensor.arange(6, device=dev) // 4 - 1).numpy()]
  for a, b in zip(run("CPU"), run("PYTHON")):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_capture_reports_kernels_copies_slices_and_host_reads():
  from tiny_tensor import Variable
  from tiny_uop.device import Buffer
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  abuf = engine.get_buffer(engine.buffer_view(a.uop)[0])
  calls: list[engine.CapturedCall] = []
  reads: list = []
  v = Variable("k", 1, 8)
  with engine.capture(calls.append, reads.append):
    y = (a * 2).realize()
    z = a.shrink(((0, v.bind(5)),)).sum().realize()
    moved = a.to(_other_device()).realize()  # a COPY reads `a` to the host: the engine's own read, not reported
    s = a[2:6].contiguous().realize()
    assert reads == []
    assert y.numpy().tolist() == [2.0 * i for i in range(8)]
    assert len(reads) == 1 and reads[0] is engine.get_buffer(engine.buffer_view(y.uop)[0])
  assert [c.kind for c in calls] == ["kernel", "kernel", "copy", "slice"]
  k = calls[0]
  assert k.bufs[1] is abuf and k.bufs[0] is engine.get_buffer(engine.buffer_view(y.uop)[0])
  assert k.device == Device.DEFAULT and k.prg is not None and k.spec.name and k.ops == 8 and k.mem == 64
  assert calls[1].var_vals == {"k": 5} and z.item() == sum(range(5))
  assert calls[2].bufs == (engine.get_buffer(engine.buffer_view(moved.uop)[0]), abuf)
  assert calls[3].bufs[1] is abuf and calls[3].bufs[0].base is abuf.base and calls[3].offset == 2 * 4
  assert s.tolist() == [2.0, 3.0, 4.0, 5.0]
  n = len(calls)
  (a + 1).realize().numpy()  # outside the block: nothing reported, no hook left behind
  assert len(calls) == n and len(reads) == 1 and Buffer.host_read_hooks == []


def test_register_buffer_checks_what_it_registers():
  from tiny_uop import UOp
  src = Tensor([1.0, 2.0, 3.0]).realize()
  buf = engine.get_buffer(engine.buffer_view(src.uop)[0])
  u = engine.register_buffer(UOp.new_buffer(buf.device, 3, buf.dtype), buf)
  assert engine.get_buffer(u) is buf and Tensor(u).tolist() == [1.0, 2.0, 3.0]
  other = engine.get_buffer(engine.buffer_view(Tensor([5.0, 6.0, 7.0]).realize().uop)[0])
  for bad in (UOp.new_buffer(buf.device, 4, buf.dtype), UOp.new_buffer(buf.device, 3, dtypes.int32), u):
    with pytest.raises(ValueError, match="register_buffer"): engine.register_buffer(bad, other)
  with pytest.raises(TypeError, match="BUFFER"): engine.register_buffer(src.uop.reshape((1, 3)), other)
  assert engine.register_buffer(u, buf) is u  # registering the same Buffer again is a no-op


def test_values_realized_along_the_way_are_not_computed_again():
  # opt.step() realizes the backward pass, which computes the forward's intermediate values; loss.realize() after it
  # must read those buffers rather than run the forward again (with the already-updated weights)
  from tiny_tensor import nn
  rng = np.random.default_rng(3)
  xs, ws = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
  w = Tensor(ws.copy(), requires_grad=True)
  opt = nn.optim.SGD([w], lr=0.5)
  hidden = Tensor(xs) @ w                      # realized by the step (the gradient needs relu's mask of it)
  loss = (hidden.relu() * hidden.exp()).sum()  # two consumers of the matmul: it gets a buffer of its own
  loss.backward()
  with Tensor.train(): opt.step()
  GlobalCounters.reset()
  got = loss.item()
  h = xs @ ws
  np.testing.assert_allclose(got, (np.maximum(h, 0) * np.exp(h)).sum(), rtol=1e-4)  # the weights before the step
  # the final reduce only, no matmul again; or none: where the step realized the matmul with its epilogue (the
  # gradient's elementwise part) in its place, the loss, still lazy over the old weights, was computed before them
  assert GlobalCounters.kernel_count <= 1


def test_devices_sharing_a_renderer_get_their_own_loaded_programs():
  # CPU and NULL:LLVM both render with LLVMRenderer: the same kernel compiles once per renderer but each device loads
  # (and runs) its own program object
  # `a` on the CPU whatever the session's device, and a constant no other test uses: the kernel is compiled here, so
  # its program is in the cache whatever ran before in this process (a cached schedule replays without a lookup)
  a = Tensor(np.ones(8, np.float32), device="CPU")
  b = Tensor(np.ones(8, np.float32), device="NULL:LLVM")
  assert (a + 3.0517578125).tolist() == [4.0517578125] * 8
  (b + 3.0517578125).realize()
  mine = {k[3]: v[1] for k, v in engine._program_cache.items() if k[1].__name__ == "LLVMRenderer"}
  assert {"CPU", "NULL"} <= set(mine) and mine["CPU"] is not mine["NULL"]
