"""HCQ2 on MOCK+QCOM: TinyJit replays lowered by tiny_uop.hcq2's passes with QCOM's encoder (`encode.pm_lower`, one
PatternMatcher over a6xx.QCOMComputeQueue's packet builders). Each lowered op's dwords equal the imperative queue's
for the same op (static and symbolic launches, image arguments, signals, barriers, indirect buffers), decoded as a6xx
packets; jitted functions (plain and IMAGE=1 textures, whose descriptors' base addresses are patched per replay) give
kernel-by-kernel replays' (`JIT=2`) results bit for bit in one submission per replay, their command buffer holding
what the queue records for the same dispatches; symbolic launch sizes are patched; unaligned texture views stay out
of graphs, unaligned texture inputs are staged."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq2 import ExecArg, HCQ2Ctx, HCQ2Graph, linear_of, run_pipeline, timeline_vars
from tiny_uop.pattern import graph_rewrite
from tiny_uop.plugins import Device

from tiny_runtime_qcom import a6xx
from tiny_runtime_qcom.mock.cp import decode_header
from tiny_runtime_qcom.mock.driver import driver

DEV = "MOCK+QCOM"
IMG_SRC = ("__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
           "/* image data1 1x4 */\n__kernel void cp(__global float* restrict data0, read_only image2d_t data1) {\n"
           "  int i = get_local_id(0); float4 t = read_imagef(data1, smp, (int2)(i, 0));\n"
           "  data0[4*i] = t.x; data0[4*i+1] = t.y; data0[4*i+2] = t.z; data0[4*i+3] = t.w;\n}\n")
UAV_SRC = ("/* image data0 2x4 */\n__kernel void fill(write_only image2d_t data0, const int var0) {\n"
           "  int x = get_group_id(0), y = get_group_id(1);\n"
           "  write_imagef(data0, (int2)(x, y), (float4)(x, y, var0, x * 10 + y));\n}\n")


@pytest.fixture(scope="module")
def dev():
  return Device[DEV]


def _buf(x) -> Buffer:
  return Buffer(DEV, x.size, dtypes.float).ensure_allocated().copyin(memoryview(np.ascontiguousarray(x, np.float32)))


def _read(b: Buffer) -> np.ndarray:
  out = np.empty(b.size, np.float32)
  b.copyout(memoryview(out))
  return out


def _axpb(dev):
  from tiny_codegen import get_program
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(256), arg=1)
  i = UOp.range(256, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo("axpb")), dev.renderer)
  return dev.get_program(spec.name, spec.lib)


def _load(dev, src: str, name: str): return dev.get_program(name, dev.renderer.compiler.compile(src))


def _u64(v: int) -> UOp: return UOp(Ops.CONST, dtypes.uint64, arg=v)


def _idx(v) -> UOp:
  return UOp(Ops.CONST, dtypes.index, arg=v) if isinstance(v, int) else UOp(Ops.DEFINE_VAR, dtypes.index,
                                                                            arg=(v, 1, 1 << 20))


def _lower(dev, op: UOp) -> UOp:
  """One queue op through QCOM's pm_lower (the graph's device as the context, as in the pipeline)."""
  out = graph_rewrite(op, dev.pm_lower, HCQ2Ctx(dev), name="test lower")
  assert out.op is Ops.PACKET
  return out


def _ints(p: UOp, vals: dict[str, int], subs: dict[UOp, UOp] | None = None) -> list[int]:
  """A packet's dwords evaluated with these variable values (and UOps substituted, e.g. ADDR -> CONST)."""
  return [int(d.arg) if d.op is Ops.CONST else (d.substitute(subs) if subs else d).sym_infer(vals) for d in p.src]


def _decode(dwords: list[int]) -> list[tuple[int, int, int]]:
  """The (type, register or opcode, count) of every packet in a stream, checked by the mock CP's decoder."""
  out, i = [], 0
  while i < len(dwords):
    out.append(h := decode_header(dwords[i], f"dword {i}"))
    i += 1 + h[2]
  assert i == len(dwords), "the last packet runs past the stream's end"
  return out


def test_the_qcom_encoder_is_one_pattern_matcher():
  from tiny_runtime_qcom.device import QCOMDevice
  from tiny_runtime_qcom.encode import pm_lower
  assert QCOMDevice.pm_lower is pm_lower and pm_lower.name == "qcom pm_lower"
  assert QCOMDevice.hcq2_copy_engine == "compute"
  assert {p.op[0] for p, _ in pm_lower.patterns} == {Ops.EXEC, Ops.WAIT, Ops.SIGNAL, Ops.MEMBAR, Ops.INDIRECT}


@pytest.mark.parametrize("which", ["buffers", "texture", "uav"])
def test_dispatch_packets_equal_the_queue_builder(dev, which):
  """EXEC -> the same dwords `QCOMComputeQueue.exec` records, for static sizes and for sizes that are variables
  (evaluated with the values the static queue got); arguments of images load their descriptors (CP_LOAD_STATE6)."""
  prg = {"buffers": lambda: _axpb(dev), "texture": lambda: _load(dev, IMG_SRC, "cp"),
         "uav": lambda: _load(dev, UAV_SRC, "fill")}[which]()
  args = dev.kernargs_alloc(prg.layout.size)
  gs, ls = (3, 2, 1), (4, 1, 1)
  want = dev.hw_compute_queue_t().exec(prg, args, gs, ls)._q
  assert all(isinstance(d, int) for d in want)
  for sizes in ((*gs, *ls), ("g0", "g1", 1, "l0", 1, 1)):
    x = UOp(Ops.EXEC, dtypes.void, (UOp(Ops.DEVICE, arg=DEV), _u64(args), *map(_idx, sizes)),
            ExecArg(prg, prg.name, 0, 0, frozenset(), frozenset()))
    p = _lower(dev, x)
    assert p.arg == f"dispatch {prg.name}"
    assert _ints(p, {"g0": 3, "g1": 2, "l0": 4}) == want
  ops = [(t, w) for t, w, _ in _decode(want)]
  assert ops[-2:] == [(7, a6xx.CP_RUN_OPENCL), (7, a6xx.CP_EVENT_WRITE)]  # the dispatch, then its write-back
  loads = sum(o == (7, a6xx.CP_LOAD_STATE6_FRAG) for o in ops)
  assert loads == 2 + (prg.layout.n_tex > 0) + (prg.layout.n_samp > 0) + (prg.layout.n_uav > 0)
  assert (which == "texture") == (prg.layout.n_tex == 1 == prg.layout.n_samp)
  assert (which == "uav") == (prg.layout.n_uav == 1)
  if which == "texture": assert (4, a6xx.REG_SP_CS_TEXMEMOBJ_BASE) in ops and (4, a6xx.REG_SP_CS_SAMPLER_BASE) in ops


def test_wait_signal_barrier_and_indirect_packets_equal_the_queue_builders(dev):
  sig = dev.new_signal(0)
  try:
    wait_v, signal_v = timeline_vars(DEV)
    for op, name, want in (
        (UOp(Ops.WAIT, dtypes.void, (wait_v,), ("compute", sig)), "wait", dev.hw_compute_queue_t().wait(sig, 41)),
        (UOp(Ops.SIGNAL, dtypes.void, (signal_v,), ("compute", sig)), "signal",
         dev.hw_compute_queue_t().signal(sig, 42)),
        (UOp(Ops.SIGNAL, dtypes.void, (_u64(0),), ("compute", sig)), "signal",
         dev.hw_compute_queue_t().signal(sig, 0)),
        (UOp(Ops.MEMBAR, dtypes.void, (), "compute"), "barrier", dev.hw_compute_queue_t().memory_barrier())):
      p = _lower(dev, op)
      assert p.arg == name and _ints(p, {f"{DEV}:wait": 41, f"{DEV}:signal": 42}) == want._q
    assert [w for _, w, _ in _decode(dev.hw_compute_queue_t().wait(sig, 1)._q)] == [a6xx.CP_WAIT_REG_MEM]
    assert [w for _, w, _ in _decode(dev.hw_compute_queue_t().signal(sig, 1)._q)] == [a6xx.CP_WAIT_FOR_IDLE,
                                                                                       a6xx.CP_EVENT_WRITE]
    # INDIRECT(body) -> CP_INDIRECT_BUFFER to the body's command buffer: ADDR(body) until HCQ2 bufferizes it
    body_pkts = [_lower(dev, UOp(Ops.MEMBAR, dtypes.void, (), "compute")) for _ in range(2)]
    body = UOp(Ops.QUEUE, dtypes.void, (UOp(Ops.DEVICE, arg=DEV), *body_pkts), ("compute", "body"))
    p = _lower(dev, UOp(Ops.INDIRECT, dtypes.void, (body,), "compute"))
    addr = [u for u in p.toposort() if u.op is Ops.ADDR]
    assert len(addr) == 1 and addr[0].src[0] is body
    got = _ints(p, {}, {addr[0]: _u64(0x12_3456_7890)})
    n = 2 * len(dev.hw_compute_queue_t().memory_barrier()._q)  # 2 barriers of 10 dwords
    assert got == dev.hw_compute_queue_t().indirect_buffer(0x12_3456_7890, n)._q
    assert _decode(got) == [(7, a6xx.CP_INDIRECT_BUFFER, 3)] and got[1:] == [0x3456_7890, 0x12, 20]
  finally: dev._free_signals.append(sig.addr)
  with pytest.raises(ValueError, match="only a compute engine"):
    _lower(dev, UOp(Ops.MEMBAR, dtypes.void, (), "copy"))


def _graph(f):
  from tiny_tensor.jit import _GraphCall
  graphs = [c.graph for c in f.captured.plan if isinstance(c, _GraphCall)]
  assert len(graphs) == 1
  return graphs[0]


def _body_and_queue(graph) -> tuple[list[int], list[int]]:
  """The dwords of the command buffer a replay runs (as HCQ2's resolve pass wrote it; a dword patched per replay read
  as -1), and what `QCOMComputeQueue` records for the same dispatches (a barrier between them, each with its argument
  region in HCQ2's KERNARGS)."""
  keep: list = []
  run_pipeline(graph.dev, linear_of(graph.dev, graph.calls), keep=keep)
  res = dict(keep)["resolve"]
  (cb,) = [u for u in res.src if u.op is Ops.CMDBUF]
  (ka,) = [u for u in res.src if u.op is Ops.KERNARGS]
  mem = (ctypes.c_uint32 * len(cb.src)).from_address(cb.arg.mem.va)
  q = graph.dev.hw_compute_queue_t()
  for n, ((off, _), k) in enumerate(zip(ka.arg.regions, graph.calls)):
    if n: q.memory_barrier()
    gs, ls = k.launch({})
    q.exec(k.prg, ka.arg.mem.va + off, gs, ls or (1, 1, 1))
  return [-1 if d.op is Ops.PATCH else mem[i] for i, d in enumerate(cb.src)], q._q


def _jitted(image: int, reps: int = 4):
  """A jitted function of several kernels and a Variable (IMAGE=1: a conv reading textures) replayed with new inputs;
  results against numpy, submissions per replay counted."""
  from tiny_tensor import Tensor, TinyJit
  from tiny_uop import Variable
  from tiny_uop.helpers import JIT

  @TinyJit
  def f(x: Tensor, w: Tensor, k) -> tuple[Tensor, Tensor]:
    h = x.conv2d(w, padding=1).relu().contiguous()
    return (h * Tensor.from_uop(k, device=DEV).cast(x.dtype)).sum(axis=(2, 3)).realize(), (h - 1).exp2().realize()
  v, stats, out = Variable("k", 1, 100), driver().cp.stats, []
  with Context(IMAGE=image):
    for i in range(reps):
      rng = np.random.default_rng(i)
      xn = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
      wn = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
      x, w = Tensor(xn, device=DEV).realize(), Tensor(wn, device=DEV).realize()
      Device[DEV].synchronize()
      before = (stats["submissions"], stats["dispatches"], stats["texture_dispatches"])
      s, e = f(x, w, v.bind(2 + 5 * i))
      sn, en = s.numpy(), e.numpy()  # the mock GPU runs the submissions when the host waits for them
      after = (stats["submissions"], stats["dispatches"], stats["texture_dispatches"])
      win = np.lib.stride_tricks.sliding_window_view(np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
      h = np.maximum(np.einsum("nchwij,ocij->nohw", win, wn), 0)
      np.testing.assert_allclose(sn, (h * (2 + 5 * i)).sum(axis=(2, 3)), rtol=1e-4, atol=1e-3)
      np.testing.assert_allclose(en, np.exp2(h - 1), rtol=1e-4, atol=1e-5)
      out.append((sn, en, tuple(a - b for a, b in zip(after, before))))
  return out, (_graph(f) if JIT.value == 1 else None), f.captured.kernel_count


@pytest.mark.parametrize("image", [0, 1])
def test_jit_through_hcq2_equals_kernel_by_kernel_bit_for_bit(dev, image):
  with Context(JIT=2): ref, _, n = _jitted(image)
  got, g, n1 = _jitted(image)
  assert isinstance(g, HCQ2Graph) and type(g).__name__ == "QCOMGraph" and n == n1
  for (s0, e0, _), (s1, e1, _) in zip(ref, got):
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(e0, e1)
  # a replay (calls 3, 4) is one submission running every kernel (kernel by kernel: one per launch)
  assert [c[:2] for _, _, c in got[2:]] == [(1, n)] * 2 and [c[:2] for _, _, c in ref[2:]] == [(n, n)] * 2
  texture_kernels = sum(bool(k.prg.layout.n_tex) for k in g.calls)
  assert (texture_kernels > 0) == bool(image) and got[2][2][2] == ref[2][2][2] == texture_kernels
  # the command buffer a replay runs is what the imperative queue records for the same dispatches (no dword of it is
  # patched per replay here: the launch sizes are constant), a stream the mock's decoder accepts
  body, want = _body_and_queue(g)
  assert body == want and _decode(body)


class _SymKernel:
  """A captured kernel as the device-graph contract describes it, with a symbolic number of work-groups."""
  def __init__(self, prg, bufs):
    self.prg, self.bufs, self.vars, self.static_launch, self.name = prg, bufs, (), False, prg.name
    self.global_size, self.local_size = ("g", 1, 1), (32, 1, 1)
  def launch(self, var_vals): return (var_vals.get("g", 8), 1, 1), (32, 1, 1)


def test_symbolic_launch_sizes_are_patched_in_the_command_buffer(dev):
  """NDRANGE_0 (local sizes), the 3 global sizes (work-groups x local size) and the 3 work-group counts are patches of
  the body's command buffer; each replay's sizes reach the dispatch."""
  from tiny_runtime_qcom.device import QCOMGraph
  prg = _axpb(dev)
  x = _buf(np.arange(256))
  outs = [_buf(np.zeros(256)) for _ in range(3)]
  graph = QCOMGraph(dev, [_SymKernel(prg, [0, x._buf])])
  keep: list = []
  run_pipeline(dev, linear_of(dev, graph.calls), keep=keep)
  (cb,) = [u for u in dict(keep)["patches"].src if u.op is Ops.CMDBUF]
  assert sum(d.op is Ops.PATCH for d in cb.src) == 7
  for out, groups in zip(outs, (3, 8, 1)): graph([out._buf], {"g": groups})
  dev.synchronize()
  for out, groups in zip(outs, (3, 8, 1)):
    np.testing.assert_array_equal(_read(out), np.where(np.arange(256) < 32 * groups, np.arange(256) * 2 + 1, 0))


def test_texture_base_addresses_are_argument_patches_and_unaligned_views_stay_out(dev):
  """A texture argument that is a replay input is a 64-bit patch of its descriptor's BASE_LO/BASE_HI (dwords 4-5 of
  A6XX_TEX_CONST); a kernel whose texture is a kept view not 32-byte aligned is not taken into a graph."""
  from tiny_runtime_qcom.device import QCOMGraph, graphable
  prg = _load(dev, IMG_SRC, "cp")
  xs = [np.arange(16) + 100 * r for r in range(3)]
  out = _buf(np.zeros(16))

  class K:
    def __init__(self, bufs): self.prg, self.bufs, self.vars, self.name = prg, bufs, (), "cp"
    global_size, local_size, static_launch = (1, 1, 1), (4, 1, 1), True
    def launch(self, var_vals): return (1, 1, 1), (4, 1, 1)
  keep: list = []
  _, ctx = run_pipeline(dev, linear_of(dev, [K([out._buf, 0])]), keep=keep)
  (ka,) = [u for u in dict(keep)["patches"].src if u.op is Ops.KERNARGS]
  (patch,) = [p for p in ka.src if p.op is Ops.PATCH]
  region = ka.arg.mem.va + ka.arg.regions[0][0]
  assert patch.arg.addr == region + prg.layout.tex_off + 4 * 4 and patch.arg.bits == 64
  for x in xs:
    ctx.fn([(inp := _buf(x))._buf], {})  # the replay HCQ2Graph calls
    dev.synchronize()
    np.testing.assert_array_equal(_read(out), x)
    base = inp._buf.va_addr
    desc = (ctypes.c_uint32 * 16).from_address(region + prg.layout.tex_off)
    assert (desc[4], desc[5]) == (base & 0xFFFFFFFF, base >> 32)
  dev.synchronize()
  for b in ctx.allocs: dev._gpu_free(b)
  whole = _buf(np.arange(40))
  for off, ok in ((0, True), (32, True), (20, False)):
    view = whole.view(16, dtypes.float32, off).ensure_allocated()
    assert graphable(dev, K([out._buf, view._buf])) is ok
    assert QCOMGraph.supports(dev, K([out._buf, view._buf])) is ok
  assert graphable(dev, K([out._buf, 0]))  # an input: its address is known at replay only


def test_unaligned_texture_inputs_are_staged_at_replay(dev):
  """IMAGE=1, a jitted conv of an input that is a view 4 bytes into its buffer (not 32-byte aligned, the texture base
  alignment): each replay reads it through an aligned staging copy, as the eager launch does; numbers against numpy."""
  from tiny_tensor import Tensor, TinyJit
  wn = np.random.default_rng(9).standard_normal((8, 4, 3, 3)).astype(np.float32)
  w = Tensor(wn, device=DEV).realize()

  @TinyJit
  def f(x: Tensor) -> Tensor: return x.conv2d(w, padding=1).relu().realize()
  with Context(IMAGE=1):
    for i in range(4):
      big = np.random.default_rng(i).standard_normal(2 * 4 * 8 * 8 + 1).astype(np.float32)
      xt = Tensor(big, device=DEV).realize()[1:].reshape(2, 4, 8, 8)
      got = f(xt).numpy()
      x = big[1:].reshape(2, 4, 8, 8)
      win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
      np.testing.assert_allclose(got, np.maximum(np.einsum("nchwij,ocij->nohw", win, wn), 0), rtol=1e-4, atol=1e-4)
  g = _graph(f)
  assert type(g).__name__ == "QCOMGraph" and g._tex_inputs and g._staged


def test_an_unaligned_input_that_is_also_a_buffer_is_a_clear_error(dev):
  from tiny_runtime_qcom.device import QCOMGraph
  img, axpb = _load(dev, IMG_SRC, "cp"), _axpb(dev)

  class K:
    def __init__(self, prg, bufs, ls): self.prg, self.bufs, self.vars, self.name, self.local_size = prg, bufs, (), \
      prg.name, ls
    global_size, static_launch = (1, 1, 1), True
    def launch(self, var_vals): return (1, 1, 1), self.local_size
  out, out2 = _buf(np.zeros(16)), _buf(np.zeros(256))
  graph = QCOMGraph(dev, [K(img, [out._buf, 0], (4, 1, 1)), K(axpb, [out2._buf, 0], (32, 1, 1))])
  whole = _buf(np.arange(300))
  graph([whole._buf], {})  # aligned: runs
  dev.synchronize()
  np.testing.assert_array_equal(_read(out), np.arange(16))
  with pytest.raises(ValueError, match=r"replay input 0 .* read as a texture.* also a buffer of axpb"):
    graph([whole.view(260, dtypes.float32, 4).ensure_allocated()._buf], {})
