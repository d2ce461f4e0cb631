"""HCQ2 on MOCK+NV: TinyJit replays lowered by tiny_uop.hcq2's passes with NV's encoder (`encode.pm_lower`, one
PatternMatcher over push.py's method builders). Results equal kernel-by-kernel replays' (`JIT=2`) bit for bit (a jitted
function of several kernels and a Variable, and a jitted training step); a replay is the same three GPFIFO entries;
a kernel -> copy-engine copy -> kernel graph runs on both channels; symbolic launch sizes are patched in the QMDs."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_uop import Context, KernelInfo, Ops, UOp, Variable, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.plugins import Device

DEV = "MOCK+NV"


def _gpu():
  from tiny_runtime_nv.mock.rm import driver
  return driver().gpus[0]


def _graph(f):
  from tiny_tensor.jit import _GraphCall
  graphs = [c.graph for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1
  return graphs[0]


def test_the_nv_encoder_is_one_pattern_matcher():
  from tiny_runtime_nv.device import NVDevice
  from tiny_runtime_nv.encode import pm_lower
  assert NVDevice.pm_lower is pm_lower and pm_lower.name == "nv pm_lower"
  # INDIRECT is left to the submit primitive: a bound command buffer is a GPFIFO entry of its own
  assert {p.op[0] for p, _ in pm_lower.patterns} == {Ops.EXEC, Ops.XFER, Ops.WAIT, Ops.SIGNAL, Ops.MEMBAR}


def _several(reps: int = 5) -> list[tuple[np.ndarray, np.ndarray, int]]:
  from tiny_tensor import Tensor, TinyJit

  @TinyJit
  def f(a: Tensor, b: Tensor, k) -> tuple[Tensor, Tensor]:
    h = (a * 2 + b).relu().contiguous()
    s = (h * Tensor.from_uop(k, device=DEV).cast(a.dtype)).sum(axis=1)
    return s.realize(), (h - a).exp2().realize()
  v, dev, out = Variable("k", 1, 100), Device[DEV], []
  for i in range(reps):
    rng = np.random.default_rng(i)
    an, bn = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    a, b = Tensor(an, device=DEV).realize(), Tensor(bn, device=DEV).realize()
    dev.synchronize()
    put = dev.compute_fifo.put
    s, e = f(a, b, v.bind(2 + 5 * i))
    entries = dev.compute_fifo.put - put
    h = np.maximum(an * 2 + bn, 0)
    np.testing.assert_allclose(s.numpy(), (h * (2 + 5 * i)).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), np.exp2(h - an), rtol=1e-5)
    out.append((s.numpy(), e.numpy(), entries))
  from tiny_uop.helpers import JIT
  if JIT.value == 1: assert isinstance(_graph(f), HCQ2Graph)
  return out


def test_jit_through_hcq2_equals_kernel_by_kernel_bit_for_bit():
  with Context(JIT=2): ref = _several()
  got = _several()
  for (s0, e0, _), (s1, e1, _) in zip(ref, got):
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(e0, e1)
  # a replay (calls 3..5) is three GPFIFO entries: wait, the body's command buffer in place, signal
  assert [n for _, _, n in got[2:]] == [3] * 3


def test_jitted_convnet_training_through_hcq2_equals_kernel_by_kernel():
  from tiny_tensor import Tensor, TinyJit, nn
  from tiny_tensor.nn.state import get_parameters

  def train() -> tuple[list[float], list[np.ndarray]]:
    Tensor.manual_seed(3)
    rng = np.random.default_rng(0)
    conv, lin = nn.Conv2d(1, 4, 3), nn.Linear(4 * 6 * 6, 10)
    params = get_parameters([conv, lin])
    for p in params: p.replace(p.to(DEV)).realize()
    opt = nn.optim.Adam(params, lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
      with Tensor.train():
        opt.zero_grad()
        loss = lin(conv(x).relu().flatten(1)).sparse_categorical_crossentropy(y).backward()
        opt.step()
        return loss.realize()
    losses = [step(Tensor(rng.standard_normal((4, 1, 8, 8)).astype(np.float32), device=DEV),
                   Tensor(rng.integers(0, 10, 4).astype(np.int32), device=DEV)).item() for _ in range(4)]
    assert step.captured.kernel_count > 5
    return losses, [p.numpy() for p in params]
  with Context(JIT=2): ref = train()
  got = train()
  assert got[0] == ref[0]  # every loss bit for bit
  for a, b in zip(ref[1], got[1]): np.testing.assert_array_equal(a, b)  # and the trained weights


class _K:
  def __init__(self, prg, bufs, gs=(8, 1, 1)):
    self.prg, self.bufs, self.vars, self.name = prg, bufs, (), prg.name
    self.global_size, self.local_size = gs, (32, 1, 1)
    self.static_launch = all(isinstance(d, int) for d in gs)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


class _Copy:
  def __init__(self, dst, src, nbytes): self.bufs, self.nbytes, self.prg = [dst, src], nbytes, None


def _axpb(dev):
  from tiny_codegen import get_program
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(256), arg=1)
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo("axpb")), dev.renderer)
  assert spec.global_size == (8, 1, 1)
  return dev.get_program(spec.name, spec.lib)


def _patches(graph):
  from tiny_uop.hcq2 import linear_of, run_pipeline
  keep = []
  run_pipeline(graph.dev, linear_of(graph.dev, graph.calls), keep=keep)
  bufs = [u for u in dict(keep)["patches"].src if u.op in (Ops.CMDBUF, Ops.KERNARGS)]
  return [p for u in bufs for p in u.src if p.op is Ops.PATCH]


def _buf(x): return Buffer(DEV, x.size, dtypes.float).copyin(memoryview(np.ascontiguousarray(x, np.float32)))


def test_kernel_copy_kernel_runs_on_both_channels():
  dev = Device[DEV]
  prg = _axpb(dev)
  mid, mid2 = _buf(np.zeros(256)), _buf(np.zeros(256))
  graph = HCQ2Graph(dev, [_K(prg, [mid._buf, 0]), _Copy(mid2._buf, mid._buf, 1024), _K(prg, [1, mid2._buf])])
  for rep in range(3):
    x, out = _buf(np.arange(256) + rep), _buf(np.zeros(256))
    dev.synchronize()
    cput, put = dev.copy_fifo.put, dev.compute_fifo.put
    graph([x._buf, out._buf], {})
    dev.synchronize()
    # copy channel: wait, the bound body; compute channel: wait, the bound body, signal (GPFIFO entries)
    assert (dev.copy_fifo.put - cput, dev.compute_fifo.put - put) == (2, 3)
    np.testing.assert_array_equal(out.numpy(), ((np.arange(256) + rep) * 2 + 1) * 2 + 1)
    assert all(s.value == 0 for s in graph.ctx.signals) and len(graph.ctx.signals) == 2


def test_a_copy_of_each_replays_input_is_patched_in_the_bound_copy_buffer():
  dev = Device[DEV]
  prg = _axpb(dev)
  mid = _buf(np.zeros(256))
  graph = HCQ2Graph(dev, [_Copy(mid._buf, 0, 1024), _K(prg, [1, mid._buf])])
  for rep in range(3):
    x, out = _buf(np.arange(256) * (rep + 1)), _buf(np.zeros(256))
    graph([x._buf, out._buf], {})
    dev.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.arange(256) * (rep + 1) * 2 + 1)
  assert "copy dword" in " ".join(p.arg.what for p in _patches(graph))


@pytest.mark.parametrize("symbolic", ["uop", "launch()"])
def test_symbolic_launch_sizes_are_patched_into_the_qmds(symbolic):
  dev = Device[DEV]
  prg = _axpb(dev)
  x = _buf(np.arange(256))
  graph = HCQ2Graph(dev, [_K(prg, [0, x._buf], gs=(Variable("g", 1, 8), 1, 1) if symbolic == "uop" else ("g", 1, 1))])
  outs = [_buf(np.zeros(256)) for _ in range(3)]
  launches = _gpu().launches
  for out, groups in zip(outs, (3, 8, 1)): graph([out._buf], {"g": groups})
  dev.synchronize()
  assert _gpu().launches - launches == 3
  for out, groups in zip(outs, (3, 8, 1)):
    np.testing.assert_array_equal(out.numpy(), np.where(np.arange(256) < 32 * groups, np.arange(256) * 2 + 1, 0))
  assert "B0_32[" in graph.source and "B1" not in graph.source  # patched in the QMD (kernargs), not the pushbuffer
