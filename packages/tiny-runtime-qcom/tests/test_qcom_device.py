"""The QCOM driver on MOCK+QCOM: KGSL objects and timestamps, kernels compiled by the (mock) device compiler and
loaded by the driver, buffers, values, textures and samplers (IMAGE=1), storage images (UAVs), image staging for
unaligned views, launch timing, and TinyJit replays through one graph (HCQ2) -- results against numpy."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from tiny_uop import Context, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.plugins import Device

from tiny_runtime_qcom import a6xx, adreno
from tiny_runtime_qcom.mock.driver import driver

DEV = "MOCK+QCOM"
rng = np.random.default_rng(7)


@pytest.fixture(scope="module")
def dev():
  return Device[DEV]


def _buf(a: np.ndarray) -> Buffer:
  dt = {np.dtype(np.float32): dtypes.float32, np.dtype(np.float16): dtypes.float16}[a.dtype]
  return Buffer(DEV, a.size, dt).ensure_allocated().copyin(memoryview(np.ascontiguousarray(a)))


def _f32(n: int | tuple[int, ...]) -> np.ndarray: return rng.standard_normal(n).astype(np.float32)


def _read(b: Buffer, dtype=np.float32) -> np.ndarray:
  out = np.empty(b.nbytes // np.dtype(dtype).itemsize, dtype)
  b.copyout(memoryview(out))
  return out


def _load(dev, src: str, name: str):
  return dev.get_program(name, dev.renderer.compiler.compile(src))


def test_device_info_memory_and_timestamps(dev):
  k = dev.kgsl
  assert k.info.version == (6, 3, 0) and k.info.arch == "a630" and dev.renderer.arch.startswith("a630")
  buf = k.alloc(5000)
  assert buf.size == 8192 and buf.cpu_mapped and buf.va_addr % 4096 == 0
  assert k.ioctl("GPUOBJ_INFO", id=buf.meta).gpuaddr == buf.va_addr  # the GPU address is the CPU mapping's
  ctypes.memset(buf.va_addr, 0x5A, 8192)
  assert buf.host_view()[8191] == 0x5A
  k.free(buf)
  with pytest.raises(Exception, match="GPUOBJ_INFO"): k.ioctl("GPUOBJ_INFO", id=buf.meta)
  dev.synchronize()
  before = k.last_timestamp
  t = dev.timeline_value
  q = a6xx.QCOMComputeQueue().signal(dev.timeline_signal, dev.next_timeline())
  q.submit(dev)
  assert k.last_timestamp == before + 1 and k.retired() == before + 1 and dev.timeline_signal.value == t


def test_copies_go_through_the_cpu_mapping(dev):
  x = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: bigger than a staging batch
  b = _buf(x)
  np.testing.assert_array_equal(_read(b), x)
  v = b.view(100, dtypes.float32, 4 * 3).ensure_allocated()  # a view at an odd offset
  np.testing.assert_array_equal(_read(v), x[3:103])
  assert dev.hw_copy_queue_t is None


SRC = """__kernel void axpb(__global float* restrict data0, __global const float* restrict data1, const int var0) {
  int gidx0 = get_group_id(0); int lidx0 = get_local_id(0);
  int i = gidx0 * 16 + lidx0;
  if (i < var0) data0[i] = data1[i] * 3.0f + (float)var0;
}
"""


def test_handwritten_kernel_with_a_value_and_local_size(dev):
  prg = _load(dev, SRC, "axpb")
  x = _f32(100)
  a, out = _buf(x), _buf(np.zeros(112, np.float32))
  et = prg(out._buf, a._buf, global_size=(7, 1, 1), local_size=(16, 1, 1), vals=(100,), wait=True)
  assert et is not None and et >= 0
  got = _read(out)
  np.testing.assert_allclose(got[:100], x * 3 + 100, rtol=1e-6)
  assert not got[100:].any()
  assert prg.layout.const_units % 4 == 0 and prg.binary.args[2].kind == adreno.ARG_CONST


def test_a_shader_over_1023_units_preloads_a_prefix_and_runs_whole(dev):
  """CP_LOAD_STATE6's NUM_UNIT has 10 bits: a shader of more than 1023 units of 128 bytes is preloaded in part and
  the SP fetches all SP_CS_INSTR_SIZE units from SP_CS_BASE. A 4000-step kernel (each step a distinct constant, so
  nothing folds) must still compute every step."""
  steps = 4000
  body = "".join(f"  acc = acc * {1 - k * 1e-6:.7f}f + {k * 1e-5:.6f}f;\n" for k in range(steps))
  src = ("__kernel void chain(__global float* restrict data0, __global const float* restrict data1) {\n"
         "  int i = get_global_id(0); float acc = data1[i];\n" + body + "  data0[i] = acc;\n}\n")
  prg = _load(dev, src, "chain")
  assert prg.instr_units > 1023
  x = _f32(32)
  ref = x.astype(np.float64)
  for k in range(steps): ref = ref * float(np.float32(1 - k * 1e-6)) + float(np.float32(k * 1e-5))
  out = _buf(np.zeros(32, np.float32))
  prg(out._buf, _buf(x)._buf, global_size=(32, 1, 1), local_size=(1, 1, 1), wait=True)
  np.testing.assert_allclose(_read(out), ref, rtol=1e-4, atol=1e-4)


def test_bad_launches_and_programs_are_clear_errors(dev):
  prg = _load(dev, SRC, "axpb")
  with pytest.raises(RuntimeError, match="work-items"):
    prg(_buf(np.zeros(4, np.float32))._buf, _buf(np.zeros(4, np.float32))._buf, local_size=(2048, 1, 1), vals=(1,))
  with pytest.raises(ValueError, match="not a QCOM program"): dev.get_program("axpb", SRC.encode())
  from tiny_uop.device import CompileError
  with pytest.raises(CompileError, match="undeclared_v"):
    dev.renderer.compiler.compile(SRC.replace("(float)var0", "undeclared_v"))


def test_tensor_math_half_and_reductions(dev):
  from tiny_tensor import Tensor
  a, b = _f32((16, 300)), _f32((300, 24))
  ta, tb = Tensor(a, device=DEV), Tensor(b, device=DEV)
  np.testing.assert_allclose((ta @ tb).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ta.max(1).numpy(), a.max(1))
  h = a[:2, :50].astype(np.float16)
  th = Tensor(h, device=DEV)
  np.testing.assert_array_equal((th * th + 1).numpy(), h * h + np.float16(1))


def _np_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win, w)


def test_image_conv_reads_textures_with_aligned_rows(dev):
  """IMAGE=1: the conv's weights and activations are textures, each described in place (pitch a multiple of 64)."""
  from tiny_tensor import Tensor, engine
  x, w = _f32((2, 4, 8, 8)), _f32((8, 4, 3, 3))  # 128 and 72 texels: rows of a multiple of 4 texels exist
  calls: list = []
  with Context(IMAGE=1), engine.capture(calls.append):
    got = Tensor(x, device=DEV).conv2d(Tensor(w, device=DEV), padding=1).relu().numpy()
  np.testing.assert_allclose(got, np.maximum(_np_conv(x, w, 1), 0), rtol=1e-4, atol=1e-4)
  srcs = [c.spec.src for c in calls if c.kind == "kernel"]
  assert any("read_imagef" in s for s in srcs)
  for s in srcs:
    for kind, _, wd in adreno.KernelInfo.of_source(s).args:
      if kind == "tex": assert (wd * 16) % 64 == 0


def test_wrong_sampler_descriptor_gives_wrong_numbers(dev, monkeypatch):
  """The mock runs the kernel with the sampler its descriptor describes: clamp-to-edge instead of clamp-to-border
  changes a padded read's value, so the descriptor is checked end to end."""
  src = ("__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
         "/* image data1 1x4 */\n__kernel void edge(__global float* restrict data0, read_only image2d_t data1) {\n"
         "  data0[0] = read_imagef(data1, smp, (int2)(-1, 0)).x;\n"
         "  data0[1] = read_imagef(data1, smp, (int2)(2, 0)).z;\n}\n")
  prg = _load(dev, src, "edge")
  img = np.arange(1, 17, dtype=np.float32)
  a, out = _buf(img), _buf(np.full(2, -7, np.float32))
  prg(out._buf, a._buf)
  np.testing.assert_array_equal(_read(out), [0, img[2 * 4 + 2]])  # outside: the zero border; texel 2's z
  samp = a6xx.tex_samp_nearest_unnorm_border()
  edge = [samp[0] & ~(0x1FF << 5) | (1 << 5) | (1 << 8) | (1 << 11)] + samp[1:]  # WRAP_S/T/R = CLAMP_TO_EDGE
  monkeypatch.setattr(a6xx, "tex_samp_nearest_unnorm_border", lambda: edge)
  prg(out._buf, a._buf)
  np.testing.assert_array_equal(_read(out), [img[0], img[10]])  # the edge texel instead of the border


def test_storage_image_written_through_a_uav_descriptor(dev):
  src = ("/* image data0 2x4 */\n__kernel void fill(write_only image2d_t data0, const int var0) {\n"
         "  int x = get_group_id(0), y = get_group_id(1);\n"
         "  write_imagef(data0, (int2)(x, y), (float4)(x, y, var0, x * 10 + y));\n}\n")
  prg = _load(dev, src, "fill")
  assert prg.layout.n_uav == 1 and prg.layout.n_tex == 0
  out = _buf(np.zeros(2 * 4 * 4, np.float32))
  prg(out._buf, global_size=(4, 2, 1), vals=(5,))
  got = _read(out).reshape(2, 4, 4)
  want = np.array([[[x, y, 5, x * 10 + y] for x in range(4)] for y in range(2)], np.float32)
  np.testing.assert_array_equal(got, want)


def test_unaligned_texture_view_is_staged(dev):
  src = ("__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
         "/* image data1 1x4 */\n__kernel void cp(__global float* restrict data0, read_only image2d_t data1) {\n"
         "  int i = get_local_id(0); float4 t = read_imagef(data1, smp, (int2)(i, 0));\n"
         "  data0[4*i] = t.x; data0[4*i+1] = t.y; data0[4*i+2] = t.z; data0[4*i+3] = t.w;\n}\n")
  prg = _load(dev, src, "cp")
  x = np.arange(40, dtype=np.float32)
  base = _buf(x)
  view = base.view(16, dtypes.float32, 4 * 5).ensure_allocated()  # 20 bytes in: not 32-byte aligned
  out = _buf(np.zeros(16, np.float32))
  prg(out._buf, view._buf, local_size=(4, 1, 1))
  np.testing.assert_array_equal(_read(out), x[5:21])


def test_jit_replays_through_one_graph_built_once(dev):
  """TinyJit's replays run one graph (QCOMGraph, an HCQ2Graph), built once."""
  from tiny_tensor import Tensor, TinyJit
  from tiny_tensor.jit import _GraphCall
  from tiny_uop import Variable

  @TinyJit
  def f(a: Tensor, b: Tensor, k) -> tuple[Tensor, Tensor]:
    h = (a * 2 + b).relu().contiguous()
    return (h * Tensor.from_uop(k, device=DEV).cast(a.dtype)).sum(axis=1).realize(), (h - a).exp2().realize()
  v = Variable("k", 1, 100)
  builds, stats = None, driver().cp.stats
  for i in range(6):
    a, b, kv = Tensor(_f32((4, 8)), device=DEV), Tensor(_f32((4, 8)), device=DEV), 1 + 3 * i
    an, bn = a.numpy(), b.numpy()
    before = (stats["dispatches"], stats["submissions"])
    s, e = f(a, b, v.bind(kv))
    h = np.maximum(an * 2 + bn, 0)
    np.testing.assert_allclose(s.numpy(), (h * kv).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), np.exp2(h - an), rtol=1e-5)
    if i >= 2:  # a replay: one submission (wait, CP_INDIRECT_BUFFER to the bound queue, signal) runs every kernel
      assert stats["dispatches"] - before[0] == f.captured.kernel_count and stats["submissions"] - before[1] == 1
    if i == 2: builds = HCQ2Graph.builds
  graphs = [c for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1 and type(graphs[0].graph).__name__ == "QCOMGraph" and isinstance(graphs[0].graph, HCQ2Graph)
  assert HCQ2Graph.builds == builds and f.captured.kernel_count >= 2


class _SymKernel:
  """A captured kernel as the device-graph contract describes it, with a symbolic number of work-groups."""
  def __init__(self, prg, bufs):
    self.prg, self.bufs, self.vars, self.static_launch = prg, bufs, (), False
    self.global_size, self.local_size = ("g", 1, 1), (32, 1, 1)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


def test_symbolic_launch_sizes_are_patched_in_the_prebuilt_command_buffer(dev):
  """The NDRANGE global size (work-groups x local size) and the work-group counts follow each replay's sizes."""
  from tiny_codegen import get_program
  from tiny_uop import KernelInfo, Ops, UOp
  c, a, b = [UOp(Ops.PARAM, dtypes.float.ptr(256), arg=i) for i in range(3)]
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() + b.index(i).load()).sink(arg=KernelInfo("E_256")),
                     dev.renderer)
  prg = dev.get_program(spec.name, spec.lib)
  xs = [np.arange(256, dtype=np.float32), np.full(256, 0.5, np.float32)]
  ins = [_buf(x) for x in xs]
  outs = [_buf(np.zeros(256, np.float32)) for _ in range(3)]
  from tiny_runtime_qcom.device import QCOMGraph
  graph = QCOMGraph(dev, [_SymKernel(prg, [0, ins[0]._buf, ins[1]._buf])])
  assert graph.source.count("B0_32[") + graph.source.count("B1_32[") == 7  # NDRANGE_0, 3 global sizes, 3 counts
  for out, groups in zip(outs, (3, 8, 1)): graph([out._buf], {"g": groups})
  dev.synchronize()
  for out, groups in zip(outs, (3, 8, 1)):
    np.testing.assert_array_equal(_read(out), np.where(np.arange(256) < 32 * groups, xs[0] + xs[1], 0))


# ***** caches: a dispatch's writes sit in UCHE until a CACHE_FLUSH_TS *****
def _axpb(dev):
  from tiny_codegen import get_program
  from tiny_uop import KernelInfo, Ops, UOp
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(256), arg=1)
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo("axpb2")), dev.renderer)
  return dev.get_program(spec.name, spec.lib), spec


def _args(dev, prg, out: Buffer, inp: Buffer) -> int:
  base = dev.kernargs_alloc(prg.layout.size)
  prg.fill_args(base, [out._buf.va_addr, inp._buf.va_addr], ())
  return base


def test_two_dispatches_with_a_barrier_in_one_submission_see_each_others_results(dev):
  """exec, memory_barrier, exec in one submission (what a JIT graph replays): the barrier must write the first
  kernel's results back before it invalidates the caches, else the second reads stale memory (tinygrad and Mesa
  write back first; the old barrier only invalidated, and the mock's UCHE drops dirty lines on an invalidate)."""
  prg, spec = _axpb(dev)
  x = _f32(256)
  bx, by, bz = _buf(x), _buf(np.zeros(256, np.float32)), _buf(np.full(256, -5, np.float32))
  q = dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier()
  q.exec(prg, _args(dev, prg, by, bx), spec.global_size, spec.local_size).memory_barrier()
  q.exec(prg, _args(dev, prg, bz, by), spec.global_size, spec.local_size)
  q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  dev.synchronize()
  assert driver().cp.cache.lost == 0
  np.testing.assert_allclose(_read(by), x * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(_read(bz), (x * 2 + 1) * 2 + 1, rtol=1e-6)


def _sync(dev) -> None:
  """Wait for everything submitted (raw submissions don't bump the timeline: a signal after them does)."""
  dev.hw_compute_queue_t().signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  dev.synchronize()


def test_mock_uche_holds_results_until_a_write_back_and_an_invalidate_loses_them(dev):
  prg, spec = _axpb(dev)
  x = _f32(256)
  bx, by = _buf(x), _buf(np.zeros(256, np.float32))
  exec_q = dev.hw_compute_queue_t().exec(prg, _args(dev, prg, by, bx), spec.global_size, spec.local_size)
  wb = dev.hw_compute_queue_t().write_back()._q
  assert exec_q._q[-len(wb):] == wb  # the driver writes back after each dispatch
  bare = exec_q._q[:-len(wb)]
  cp, lost = driver().cp, driver().cp.cache.lost
  # the dispatch alone: its results wait in UCHE; KGSL's end-of-submission CACHE_FLUSH_TS writes them back
  dev.submit_dwords(bare)
  _sync(dev)
  np.testing.assert_allclose(_read(by), x * 2 + 1, rtol=1e-6)
  assert not cp.cache.dirty
  # dispatch, then CACHE_INVALIDATE without a write-back: the dirty lines are dropped, memory keeps the old bytes
  bz = _buf(np.full(256, 7, np.float32))
  bare = dev.hw_compute_queue_t().exec(prg, _args(dev, prg, bz, bx), spec.global_size, spec.local_size)._q[:-len(wb)]
  dev.submit_dwords(bare + [a6xx.pkt7(a6xx.CP_EVENT_WRITE, 1), a6xx.CACHE_INVALIDATE])
  _sync(dev)
  assert cp.cache.lost == lost + 1
  np.testing.assert_array_equal(_read(bz), np.full(256, 7, np.float32))
