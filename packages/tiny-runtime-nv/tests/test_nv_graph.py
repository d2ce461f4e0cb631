"""TinyJit on MOCK+NV replays through HCQ2Graph: the captured kernels become one command buffer (NV's encoder's QMD
launches and barriers in GPU memory) built once; a replay patches input addresses and variable values in the
argument regions (constant bank 0 of each kernel) and the launch sizes in their QMDs, then submits three GPFIFO
entries on the compute channel: wait for the timeline, the bound buffer as it is, signal the timeline."""
from __future__ import annotations

import numpy as np
from tiny_uop import Variable
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.plugins import Device

DEV = "MOCK+NV"


def _t(shape, seed):
  from tiny_tensor import Tensor
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=DEV)


def _launches() -> int:
  from tiny_runtime_nv.mock.rm import driver
  return driver().gpus[0].launches


def test_jit_replays_one_prebuilt_command_buffer_patched_per_call():
  from tiny_tensor import Tensor, TinyJit
  from tiny_tensor.jit import _GraphCall

  @TinyJit
  def f(a: Tensor, b: Tensor, k) -> tuple[Tensor, Tensor]:
    h = (a * 2 + b).relu().contiguous()
    s = (h * Tensor.from_uop(k, device=DEV).cast(a.dtype)).sum(axis=1)
    return s.realize(), (h - a).exp2().realize()
  v = Variable("k", 1, 100)
  dev = Device[DEV]
  builds = None
  for i in range(6):
    a, b, kv = _t((4, 8), i), _t((4, 8), 40 + i), 2 + 5 * i
    an, bn = a.numpy(), b.numpy()
    launches, put = _launches(), dev.compute_fifo.put
    s, e = f(a, b, v.bind(kv))
    h = np.maximum(an * 2 + bn, 0)
    np.testing.assert_allclose(s.numpy(), (h * kv).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), np.exp2(h - an), rtol=1e-5)
    if i >= 2:  # a replay: every captured kernel ran, from 3 GPFIFO entries (wait, the bound buffer, signal)
      assert _launches() - launches == f.captured.kernel_count >= 2
      assert dev.compute_fifo.put - put == 3
    if i == 2: builds = HCQ2Graph.builds
  graphs = [c for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1 and isinstance(graphs[0].graph, HCQ2Graph)
  assert HCQ2Graph.builds == builds  # replays 4..6 patched the graph built at the capture, never rebuilt it


class _SymKernel:
  """A captured kernel as the device-graph contract describes it, with a symbolic number of blocks."""
  def __init__(self, prg, bufs):
    self.prg, self.bufs, self.vars, self.static_launch = prg, bufs, (), False
    self.global_size, self.local_size = ("g", 1, 1), (32, 1, 1)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


def test_symbolic_launch_sizes_are_patched_into_the_qmds():
  from tiny_codegen import get_program
  from tiny_uop import KernelInfo, Ops, UOp, dtypes
  from tiny_uop.device import Buffer
  dev = Device[DEV]
  c, a, b = [UOp(Ops.PARAM, dtypes.float.ptr(256), arg=i) for i in range(3)]
  i = UOp.range(256, 0)
  ast = c.index(i).store(a.index(i).load() + b.index(i).load()).sink(arg=KernelInfo("E_sym"))
  spec = get_program(ast, dev.renderer)
  prg = dev.get_program(spec.name, spec.lib)
  xs = [np.arange(256, dtype=np.float32), np.full(256, 0.5, np.float32)]
  ins = [Buffer(DEV, 256, dtypes.float).copyin(memoryview(x)) for x in xs]
  outs = [Buffer(DEV, 256, dtypes.float).copyin(memoryview(np.zeros(256, np.float32))) for _ in range(3)]
  graph = HCQ2Graph(dev, [_SymKernel(prg, [0, ins[0]._buf, ins[1]._buf])])
  for out, groups in zip(outs, (3, 8, 1)): graph([out._buf], {"g": groups})
  dev.synchronize()
  for out, groups in zip(outs, (3, 8, 1)):
    np.testing.assert_array_equal(out.numpy(), np.where(np.arange(256) < 32 * groups, xs[0] + xs[1], 0))
