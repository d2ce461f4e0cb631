"""TinyJit's device graph on MOCK+AMD (HCQ2Graph): the captured kernels become one prebuilt PM4 command buffer (an
indirect buffer) built once; replays patch input addresses, variable values and launch sizes and submit a short
ring queue. Results are checked against numpy; builds, dispatches and ring dwords are counted."""
from __future__ import annotations

import numpy as np
import pytest


from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_uop import KernelInfo, Ops, UOp, Variable, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq2 import HCQ2Graph, linear_of, run_pipeline
from tiny_uop.plugins import Device

pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
DEV = "MOCK+AMD"


def _rng_t(shape, seed):
  from tiny_tensor import Tensor
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=DEV)


def _driver():
  from tiny_runtime_amd.mock.driver import driver
  return driver()


def test_jit_replays_several_kernels_through_one_graph_built_once():
  from tiny_tensor import Tensor, TinyJit
  from tiny_tensor.jit import _GraphCall

  @TinyJit
  def f(a: Tensor, b: Tensor, k) -> tuple[Tensor, Tensor]:
    h = (a * 2 + b).relu().contiguous()
    s = (h * Tensor.from_uop(k, device=DEV).cast(a.dtype)).sum(axis=1)
    return s.realize(), (h - a).exp2().realize()
  v = Variable("k", 1, 100)
  builds = None
  dev = Device[DEV]
  for i in range(7):
    a, b, kv = _rng_t((4, 8), i), _rng_t((4, 8), 50 + i), 1 + 3 * i
    an, bn = a.numpy(), b.numpy()
    before, wptr = _driver().dispatches, dev.compute_ring.wptr
    s, e = f(a, b, v.bind(kv))
    if i >= 2:  # a replay: one short submission (wait, indirect buffer, signal), whatever the number of kernels
      assert dev.compute_ring.wptr - wptr <= 40
    h = np.maximum(an * 2 + bn, 0)
    np.testing.assert_allclose(s.numpy(), (h * kv).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), np.exp2(h - an), rtol=1e-5)
    if i >= 2:
      assert _driver().dispatches - before == f.captured.kernel_count
    if i == 2: builds = HCQ2Graph.builds
  graphs = [c for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1 and len(graphs[0].kernels) == f.captured.kernel_count >= 2
  assert HCQ2Graph.builds == builds  # replays 3..7 patched the graph built after the capture, never rebuilt it
  assert isinstance(graphs[0].graph, HCQ2Graph)


def test_same_inputs_queue_without_waiting_new_inputs_patch_after_the_last_replay():
  from tiny_tensor import Tensor, TinyJit

  @TinyJit
  def f(a: Tensor) -> Tensor: return (a * a + 1).realize()
  x = _rng_t((64,), 3)
  for _ in range(3): f(x)
  dev = Device[DEV]
  graph = f.captured.plan[-1].graph
  dev.synchronize()
  start = dev.timeline_signal.value
  for _ in range(4): f(x)  # nothing changed: nothing patched, so nothing waited (the mock GPU runs only when polled)
  assert dev.timeline_signal.value == start and graph.last_signal == start + 4
  y = _rng_t((64,), 4)
  out = f(y)  # a new input address: the graph waits for its last replay before patching the argument region
  assert dev.timeline_signal.value >= start + 4
  np.testing.assert_allclose(out.numpy(), y.numpy() ** 2 + 1, rtol=1e-6)


def test_jit2_replays_kernel_by_kernel_and_copies_split_graphs():
  from tiny_tensor import Context, Tensor, TinyJit
  from tiny_tensor.jit import _CopyCall, _GraphCall, _KernelCall

  def fn(a: Tensor) -> Tensor:
    b = (a + 1).realize()
    c = b.to("CPU").realize().to(DEV)
    return (c * 2 + b).realize()
  with Context(JIT=2):
    f2 = TinyJit(fn)
    for i in range(3): f2(_rng_t((8,), i))
  assert not any(isinstance(c, _GraphCall) for c in f2.captured.plan)
  f1 = TinyJit(fn)
  for i in range(4):
    x = _rng_t((8,), 10 + i)
    np.testing.assert_allclose(f1(x).numpy(), (x.numpy() + 1) * 3, rtol=1e-6)
  kinds = [type(c) for c in f1.captured.plan]
  assert _GraphCall in kinds and _CopyCall in kinds and _KernelCall not in kinds[:1]


class _SymKernel:
  """A captured kernel as the device-graph contract describes it, with a symbolic number of work-groups."""
  def __init__(self, prg, bufs):
    self.prg, self.bufs, self.vars, self.static_launch = prg, bufs, (), False
    self.global_size, self.local_size = ("g", 1, 1), (32, 1, 1)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


def test_symbolic_launch_sizes_are_patched_in_the_prebuilt_command_buffer():
  dev = Device[DEV]
  c, a, b = [UOp(Ops.PARAM, dtypes.float.ptr(256), arg=i) for i in range(3)]
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() + b.index(i).load()).sink(arg=KernelInfo("E_256")),
                     dev.renderer)
  assert spec.global_size == (8, 1, 1)
  prg = dev.get_program(spec.name, spec.lib)
  xs = [np.arange(256, dtype=np.float32), np.full(256, 0.5, np.float32)]
  ins = [Buffer(DEV, 256, dtypes.float).copyin(memoryview(x)) for x in xs]
  outs = [Buffer(DEV, 256, dtypes.float).copyin(memoryview(np.zeros(256, np.float32))) for _ in range(3)]
  calls = [_SymKernel(prg, [0, ins[0]._buf, ins[1]._buf])]
  graph = HCQ2Graph(dev, calls)
  keep: list = []
  run_pipeline(dev, linear_of(dev, calls), keep=keep)
  cmd = [p for u in dict(keep)["patches"].src if u.op is Ops.CMDBUF for p in u.src if p.op is Ops.PATCH]
  # 3 grid + 3 block sizes are patched in the command buffer (asked of the kernel's `launch` each replay); everything
  # else there is constant
  assert len(cmd) == 6 and {v.arg[0] for p in cmd for v in p.src[0].toposort() if v.op is Ops.DEFINE_VAR} == \
    {f"launch0.{w}{a}" for w in "gl" for a in range(3)}
  for out, groups in zip(outs, (3, 8, 1)):
    graph([out._buf], {"g": groups})
  dev.synchronize()
  for out, groups in zip(outs, (3, 8, 1)):
    want = np.where(np.arange(256) < 32 * groups, xs[0] + xs[1], 0)
    np.testing.assert_array_equal(out.numpy(), want)
