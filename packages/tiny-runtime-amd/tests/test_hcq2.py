"""HCQ2 on MOCK+AMD: TinyJit replays lowered by tiny_uop.hcq2's passes with AMD's encoder (`encode.pm_lower`, one
PatternMatcher over pm4.py/sdma.py's builders). Results are compared with kernel-by-kernel replays (`JIT=2`, bit for
bit) and numpy; the PM4 it encodes is compared with what the PM4 queue records for the same dispatches; a kernel ->
SDMA copy -> kernel graph runs with its compute/copy dependencies; symbolic launch sizes are patched in the command
buffer and the dispatch packet."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from jit_cases import several_kernels, train_losses
from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_uop import Context, KernelInfo, Ops, UOp, Variable, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq2 import HCQ2Graph, linear_of, run_pipeline
from tiny_uop.plugins import Device

pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
DEV = "MOCK+AMD"


def _driver():
  from tiny_runtime_amd.mock.driver import driver
  return driver()


def _graph(f):
  from tiny_tensor.jit import _GraphCall
  graphs = [c.graph for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1
  return graphs[0]


def test_the_amd_encoder_is_one_pattern_matcher():
  from tiny_runtime_amd.device import AMDDevice
  from tiny_runtime_amd.encode import pm_lower
  assert AMDDevice.pm_lower is pm_lower and pm_lower.name == "amd pm_lower"
  assert {p.op[0] for p, _ in pm_lower.patterns} == {Ops.EXEC, Ops.XFER, Ops.WAIT, Ops.SIGNAL, Ops.MEMBAR, Ops.INDIRECT}


def test_jit_through_hcq2_equals_kernel_by_kernel_replays_bit_for_bit():
  with Context(JIT=2): ref = several_kernels(DEV)
  builds = HCQ2Graph.builds
  got = several_kernels(DEV)
  assert HCQ2Graph.builds == builds + 1  # built once, after the capture; the later calls replayed it
  for (s0, e0), (s1, e1) in zip(ref, got):
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(e0, e1)


def test_hcq2_0_is_a_clear_error():
  from tiny_tensor import Tensor, TinyJit
  f = TinyJit(lambda a: (a * 2).realize())
  with Context(HCQ2=0), pytest.raises(ValueError, match="HCQ2=0 asks for the imperative HCQGraph, which was removed"):
    for _ in range(3): f(Tensor(np.ones(4, np.float32), device=DEV))


def test_a_replay_is_one_short_submission():
  from tiny_tensor import Tensor, TinyJit
  dev = Device[DEV]
  f = TinyJit(lambda a, b: ((a + b).contiguous() * a).sum().realize())
  for i in range(4):
    a, b = (Tensor(np.full(16, i + j, np.float32), device=DEV).realize() for j in (1, 2))
    dev.synchronize()
    wptr, sdma, dispatches = dev.compute_ring.wptr, dev.copy_ring.wptr, _driver().dispatches
    out = f(a, b)
    dev.synchronize()
    per_replay = (dev.compute_ring.wptr - wptr, dev.copy_ring.wptr - sdma, _driver().dispatches - dispatches)
    assert out.item() == 16 * (2 * i + 3) * (i + 1)
  assert isinstance(_graph(f), HCQ2Graph)
  # one ring submission (wait, barrier, INDIRECT_BUFFER, signal), no SDMA work, every kernel dispatched
  sig = dev.timeline_signal
  kick = dev.hw_compute_queue_t().wait(sig, 1).memory_barrier().indirect_buffer(0x1000, 8).signal(sig, 2)
  assert per_replay == (len(kick), 0, 2)


def test_the_encoded_pm4_is_what_the_pm4_queue_records():
  from tiny_tensor import Tensor, TinyJit
  f = TinyJit(lambda a: ((a * 2).contiguous() + a).exp2().realize())
  x = Tensor(np.ones(32, np.float32), device=DEV).realize()
  for _ in range(3): f(x)
  kernels = _graph(f).calls
  dev = Device[DEV]
  keep = []
  run_pipeline(dev, linear_of(dev, kernels), keep=keep)
  st = dict(keep)
  cmdbuf = next(u for u in st["resolve"].src if u.op is Ops.CMDBUF)
  ka = next(u for u in st["resolve"].src if u.op is Ops.KERNARGS)
  new = list((ctypes.c_uint32 * len(cmdbuf.src)).from_address(cmdbuf.arg.mem.va))
  assert len(ka.arg.regions) == len(kernels) >= 2
  # the same dispatches recorded by the PM4 queue: a barrier between them, each with its argument region
  q = dev.hw_compute_queue_t()
  for n, ((off, _), k) in enumerate(zip(ka.arg.regions, kernels)):
    if n: q.memory_barrier()
    gs, ls = k.launch({})
    lay = k.prg.args_layout(len(k.bufs), len(k.vars))
    q.exec(k.prg, ka.arg.mem.va + off + lay.args_offset, (tuple(gs) + (1, 1))[:3], (tuple(ls or ()) + (1, 1, 1))[:3])
  assert new == q.resolved()
  for (off, _), k in zip(ka.arg.regions, kernels):  # the dispatch packets (launch sizes) are fill_launch's
    gs, ls = k.launch({})
    ref = ctypes.create_string_buffer(k.prg.args_layout(len(k.bufs), len(k.vars)).size)
    k.prg.fill_launch(ctypes.addressof(ref), (tuple(gs) + (1, 1))[:3], (tuple(ls or ()) + (1, 1, 1))[:3])
    assert ctypes.string_at(ka.arg.mem.va + off, 24) == ref.raw[:24]


def test_jitted_convnet_training_through_hcq2_equals_kernel_by_kernel_and_matches_cpu():
  from tiny_tensor import Tensor
  Tensor.manual_seed(3)
  cpu, _, _ = train_losses("CPU", 4)
  runs, builds = {}, HCQ2Graph.builds
  for jit in (2, 1):
    Tensor.manual_seed(3)
    with Context(JIT=jit): runs[jit] = train_losses(DEV, 4)
  assert HCQ2Graph.builds - builds == 1  # one graph for the whole step
  assert runs[1][0] == runs[2][0] and runs[1][1] == runs[2][1] > 5  # losses bit for bit, same kernels per step
  for a, b in zip(runs[2][2], runs[1][2]): np.testing.assert_array_equal(a, b)  # the trained weights too
  np.testing.assert_allclose(runs[1][0], cpu, rtol=1e-4, atol=1e-5)


class _K:
  """A captured kernel as the device-graph contract describes it."""
  def __init__(self, prg, bufs, gs=(8, 1, 1), ls=(32, 1, 1)):
    self.prg, self.bufs, self.vars, self.name = prg, bufs, (), prg.name
    self.global_size, self.local_size = gs, ls
    self.static_launch = all(isinstance(d, int) for d in gs + ls)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


class _Copy:
  def __init__(self, dst, src, nbytes): self.bufs, self.nbytes, self.prg = [dst, src], nbytes, None


def _axpb(dev):
  """out[i] = in[i] * 2 + 1 over 256 floats (8 groups of 32)."""
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(256), arg=1)
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo("axpb")), dev.renderer)
  assert spec.global_size == (8, 1, 1)
  return dev.get_program(spec.name, spec.lib)


def _buf(x): return Buffer(DEV, x.size, dtypes.float).copyin(memoryview(np.ascontiguousarray(x, np.float32)))


def test_kernel_copy_kernel_runs_on_both_engines_with_their_dependencies():
  dev = Device[DEV]
  prg = _axpb(dev)
  mid, mid2 = _buf(np.zeros(256)), _buf(np.zeros(256))
  graph = HCQ2Graph(dev, [_K(prg, [mid._buf, 0]), _Copy(mid2._buf, mid._buf, 1024), _K(prg, [1, mid2._buf])])
  assert "S0(" in graph.source and "S1(" in graph.source  # a copy (SDMA) and a compute submission per replay
  for rep in range(3):
    x, out = _buf(np.arange(256) + rep), _buf(np.zeros(256))
    sdma, copies = dev.copy_ring.wptr, sum(g.copies for g in _driver().by_id.values())
    graph([x._buf, out._buf], {})
    dev.synchronize()
    assert dev.copy_ring.wptr > sdma and sum(g.copies for g in _driver().by_id.values()) - copies == 1
    np.testing.assert_array_equal(out.numpy(), ((np.arange(256) + rep) * 2 + 1) * 2 + 1)
    assert all(s.value == 0 for s in graph.ctx.signals) and len(graph.ctx.signals) == 2  # reset by the join


def test_a_copy_of_each_replays_input_is_a_parameter_of_the_sdma_submission():
  # SDMA bodies are copied into the kick (no indirect buffer), so the input's address is a parameter of that host
  # template, computed per replay; the kernel that reads the copy waits for the copy queue's signal
  dev = Device[DEV]
  prg = _axpb(dev)
  mid = _buf(np.zeros(256))
  graph = HCQ2Graph(dev, [_Copy(mid._buf, 0, 1024), _K(prg, [1, mid._buf])])
  assert "S0([[" in graph.source and "p0" in graph.source.split("S0(")[1].split("\n")[0]
  for rep in range(3):
    x, out = _buf(np.arange(256) * (rep + 1)), _buf(np.zeros(256))
    graph([x._buf, out._buf], {})
    dev.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.arange(256) * (rep + 1) * 2 + 1)


@pytest.mark.parametrize("symbolic", ["uop", "launch()"])
def test_symbolic_launch_sizes_are_patched(symbolic):
  dev = Device[DEV]
  prg = _axpb(dev)
  x = _buf(np.arange(256))
  gs = (Variable("g", 1, 8), 1, 1) if symbolic == "uop" else ("g", 1, 1)
  graph = HCQ2Graph(dev, [_K(prg, [0, x._buf], gs=gs)])
  outs = [_buf(np.zeros(256)) for _ in range(3)]
  for out, groups in zip(outs, (3, 8, 1)): graph([out._buf], {"g": groups})
  dev.synchronize()
  for out, groups in zip(outs, (3, 8, 1)):
    np.testing.assert_array_equal(out.numpy(), np.where(np.arange(256) < 32 * groups, np.arange(256) * 2 + 1, 0))
  # DISPATCH_DIRECT's group counts are patched in the command buffer, the dispatch packet's grid size in kernargs
  assert graph.source.count("B1_32[") >= 1 and graph.source.count("B0_32[") >= 1
