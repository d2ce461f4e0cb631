"""HCQ2's passes on a pure-Python HCQ device: what a new backend (QCOM, ...) writes to plug in is its queue encoding
(one PatternMatcher, `pm_lower`, built on its own HWQueue packet builder) and its primitives (signals, a submit
function, its programs' argument layout). The device's "GPU" interprets the packets, including waits between its
compute and copy engines, so replays of kernel -> copy -> kernel are checked value by value; every pass's output is
inspected (queues, dependencies, signals, resets, patches, the generated replay)."""
from __future__ import annotations

import ctypes
import struct

import pytest

from tiny_uop import Context, Ops, PatternMatcher, UPat, Variable
from tiny_uop.hcq import HCQAllocator, HCQBuffer, HCQCompiled, HCQProgram, HCQSignal, HWQueue, hi32, lo32
from tiny_uop.hcq2 import PIPELINE, HCQ2Graph, addr_of, body_dwords, exec_parts, linear_of, packet, run_pipeline

# ***** the device: an encoding, a GPU that runs it, programs *****
OP_WAIT, OP_SIGNAL, OP_BARRIER, OP_EXEC, OP_COPY, OP_INDIRECT = range(1, 7)
SIZES = {OP_WAIT: 5, OP_SIGNAL: 5, OP_BARRIER: 1, OP_EXEC: 10, OP_COPY: 6, OP_INDIRECT: 4}


class FakeQueue(HWQueue):
  """The device's packet builder (an eager path would use it too): one opcode dword, then the operands."""
  def wait(self, signal, value=0):
    return self.q(OP_WAIT, lo32(signal.addr), hi32(signal.addr), lo32(value), hi32(value))
  def signal(self, signal, value=0):
    return self.q(OP_SIGNAL, lo32(signal.addr), hi32(signal.addr), lo32(value), hi32(value))
  def memory_barrier(self): return self.q(OP_BARRIER)
  def exec(self, prg, args_addr, global_size, local_size):
    return self.q(OP_EXEC, prg.pid, lo32(args_addr), hi32(args_addr), *global_size, *local_size)
  def copy(self, dest, src, size): return self.q(OP_COPY, lo32(dest), hi32(dest), lo32(src), hi32(src), size)
  def indirect(self, addr, ndwords): return self.q(OP_INDIRECT, lo32(addr), hi32(addr), ndwords)


# the whole command encoding of this device for HCQ2
pm_lower_fake = PatternMatcher([
  (UPat(Ops.EXEC, name="x"), lambda x: packet(FakeQueue().exec(*exec_parts(x)), "exec")),
  (UPat(Ops.XFER, name="x"), lambda x: packet(FakeQueue().copy(x.src[1], x.src[2], x.arg.nbytes), "copy")),
  (UPat(Ops.WAIT, name="x"), lambda x: packet(FakeQueue().wait(x.arg[1], x.src[0]), "wait")),
  (UPat(Ops.SIGNAL, name="x"), lambda x: packet(FakeQueue().signal(x.arg[1], x.src[0]), "signal")),
  (UPat(Ops.MEMBAR, name="x"), lambda x: packet(FakeQueue().memory_barrier(), "barrier")),
  (UPat(Ops.INDIRECT, src=(UPat(Ops.QUEUE),), name="x"),
   lambda x: packet(FakeQueue().indirect(addr_of(x.src[0]), body_dwords(x.src[0])), "indirect")),
], name="fake pm_lower")


def u32(addr): return ctypes.c_uint32.from_address(addr).value
def u64(addr): return ctypes.c_uint64.from_address(addr).value


class FakeGPU:
  """Runs each engine's submitted dwords in order; a WAIT whose signal is too low blocks that engine until the other
  engine gets further. `run()` goes until nothing can make progress."""
  def __init__(self, dev):
    self.dev, self.streams = dev, {"compute": [], "copy": []}  # per engine: a stack of [dwords, pc]
    self.pending = {"compute": [], "copy": []}
    self.log: list[tuple[str, str]] = []

  def run(self):
    progress = True
    while progress:
      progress = False
      for eng in ("compute", "copy"):
        while self.step(eng): progress = True

  def step(self, eng):
    st = self.streams[eng]
    if not st:
      if not self.pending[eng]: return False
      st.append([self.pending[eng].pop(0), 0])
    d, pc = st[-1]
    if pc >= len(d):
      st.pop()
      return True
    op = d[pc]
    a = d[pc + 1] | d[pc + 2] << 32 if op in (OP_WAIT, OP_SIGNAL, OP_EXEC, OP_COPY, OP_INDIRECT) else 0
    if op == OP_WAIT:
      if u64(a) < (d[pc + 3] | d[pc + 4] << 32): return False
    elif op == OP_SIGNAL: ctypes.c_uint64.from_address(a).value = d[pc + 3] | d[pc + 4] << 32
    elif op == OP_EXEC:
      a = d[pc + 2] | d[pc + 3] << 32
      self.dev.programs[d[pc + 1]].run(a, d[pc + 4:pc + 7], d[pc + 7:pc + 10])
      self.log.append((eng, "exec"))
    elif op == OP_COPY:
      ctypes.memmove(a, d[pc + 3] | d[pc + 4] << 32, d[pc + 5])
      self.log.append((eng, "copy"))
    elif op == OP_INDIRECT:
      st[-1][1] = pc + SIZES[op]
      st.append([list((ctypes.c_uint32 * d[pc + 3]).from_address(a)), 0])
      return True
    elif op != OP_BARRIER: raise RuntimeError(f"fake GPU: bad opcode {op} at {pc}")
    st[-1][1] = pc + SIZES[op]
    return True


class FakeDevice(HCQCompiled):
  """An HCQ device made of what HCQ2 asks of a backend: `pm_lower`, signals, `hcq_submitter`, memory."""
  hw_compute_queue_t = hw_copy_queue_t = FakeQueue
  pm_lower = pm_lower_fake

  def __init__(self):
    self.mem, self.programs, self.gpu = [], {}, FakeGPU(self)
    self.submits: list[tuple[str, int]] = []
    super().__init__("FAKE", HCQAllocator(self), [], Scale)

  def _gpu_alloc(self, size, host=False):
    self.mem.append(m := ctypes.create_string_buffer(max(size, 8) + 256))
    base = (ctypes.addressof(m) + 255) & ~255
    return HCQBuffer(base, size, cpu_mapped=True)

  def _gpu_free(self, buf): pass
  def new_signal(self, value=0): return HCQSignal(self._gpu_alloc(16).va_addr, value, progress=self.gpu.run)

  def hcq_submitter(self, engine):
    def submit(parts):
      for p in parts:
        if not isinstance(p, list): raise AssertionError(f"this device runs bound buffers by INDIRECT, got {p}")
        self.gpu.pending[engine].append(p)
        self.submits.append((engine, len(p)))
    return submit


class Scale(HCQProgram):
  """out[i] = in[i] * k for i < global * local (float32); arguments: out, in (64-bit), k (int32)."""
  def __init__(self, dev, pid):
    self.dev, self.pid, self.name = dev, pid, f"scale{pid}"
    dev.programs[pid] = self

  def run(self, args, gs, ls):
    out, src, k = struct.unpack("<QQi", ctypes.string_at(args, 20))
    for i in range(gs[0] * ls[0]):
      ctypes.c_float.from_address(out + 4 * i).value = ctypes.c_float.from_address(src + 4 * i).value * k


class K:
  """A kernel as the device-graph contract describes it (docs/PIPELINE.md §7)."""
  def __init__(self, prg, bufs, k, gs=(2, 1, 1), ls=(4, 1, 1)):
    self.prg, self.bufs, self.vars, self.name = prg, bufs, (("k", k),), prg.name
    self.global_size, self.local_size = gs, ls
    self.static_launch = all(isinstance(d, int) for d in gs + ls)

  def launch(self, vv):
    return tuple(vv.get(d, 2) if isinstance(d, str) else d for d in self.global_size), self.local_size


class Copy:
  """A copy between two buffers of the device: `bufs = [dst, src]` (opaque or input index), `nbytes`."""
  def __init__(self, dst, src, nbytes): self.bufs, self.nbytes, self.prg = [dst, src], nbytes, None


def floats(buf, n=8): return list(struct.unpack(f"<{n}f", ctypes.string_at(buf.va_addr, 4 * n)))


def put(buf, vals): ctypes.memmove(buf.va_addr, struct.pack(f"<{len(vals)}f", *vals), 4 * len(vals))


@pytest.fixture
def dev(): return FakeDevice()


def _chain(dev, gs=(2, 1, 1)):
  """in0 -> scale -> mid -> copy -> mid2 -> scale (launch `gs`) -> in1."""
  mid, mid2 = dev._gpu_alloc(32), dev._gpu_alloc(32)
  return [K(Scale(dev, 0), [mid, 0], 3), Copy(mid2, mid, 32), K(Scale(dev, 1), [1, mid2], 3, gs=gs)], mid, mid2


def test_every_pass_is_named_and_printable(dev, capsys):
  calls, _, _ = _chain(dev)
  keep = []
  with Context(HCQ2=2): run_pipeline(dev, linear_of(dev, calls), keep=keep)
  names = [n for n, _ in keep]
  assert names == [n for n, _ in PIPELINE] == ["prepare", "split", "deps", "timeline", "resets", "kernargs", "lower",
                                               "bufferize", "patches", "resolve", "host", "callify"]
  out = capsys.readouterr().out
  for n in names: assert f"*** HCQ2 FAKE after {n}:" in out
  assert "def replay(inputs, vv):" in out and "QUEUE" in out and "PATCH" in out


def test_split_deps_timeline_and_resets(dev):
  calls, _, _ = _chain(dev)
  keep = []
  run_pipeline(dev, linear_of(dev, calls), keep=keep)
  st = dict(keep)
  assert st["prepare"].op is Ops.LINEAR and [u.op for u in st["prepare"].src] == [Ops.EXEC, Ops.XFER, Ops.EXEC]
  queues = {q.arg[0]: q for q in st["split"].src}
  assert set(queues) == {"compute", "copy"}
  assert [u.op for u in queues["compute"].src[1:]] == [Ops.EXEC, Ops.EXEC] and queues["copy"].src[1].op is Ops.XFER
  deps = {q.arg[0]: [(u.op, u.src[0].arg if u.op in (Ops.WAIT, Ops.SIGNAL) else None) for u in q.src[1:]]
          for q in st["deps"].src}
  # the copy reads what kernel 1 wrote: compute signals 1 after it, copy waits for 1; kernel 2 reads the copy's
  # output: copy signals 1 (its end), compute waits for it (then a barrier); the join (compute) waits for the copy
  # queue's last value at its end
  assert deps["compute"] == [(Ops.EXEC, None), (Ops.SIGNAL, 1), (Ops.WAIT, 1), (Ops.MEMBAR, None), (Ops.EXEC, None),
                             (Ops.WAIT, 1)]
  assert deps["copy"] == [(Ops.WAIT, 1), (Ops.XFER, None), (Ops.SIGNAL, 1)]
  sigs = {q.arg[0]: {u.arg[1] for u in q.src[1:] if u.op is Ops.SIGNAL} for q in st["deps"].src}
  assert len(sigs["compute"] | sigs["copy"]) == 2 and not sigs["compute"] & sigs["copy"]
  kicks = st["timeline"].src
  assert [k.arg for k in kicks] == [("copy", "kick"), ("compute", "kick")]
  assert [u.op for u in kicks[1].src[1:]] == [Ops.WAIT, Ops.MEMBAR, Ops.INDIRECT, Ops.SIGNAL]  # only the join signals
  assert [u.op for u in kicks[0].src[1:]] == [Ops.WAIT, Ops.MEMBAR, Ops.INDIRECT]
  assert kicks[1].src[1].arg[1] is dev.timeline_signal and kicks[1].src[4].src[0].arg[0] == "FAKE:signal"
  join = next(u.src[0] for u in st["resets"].toposort() if u.op is Ops.INDIRECT and u.arg == "compute")
  resets = [u for u in join.src[1:] if u.op is Ops.SIGNAL and u.src[0].arg == 0]
  assert {u.arg[1] for u in resets} == sigs["compute"] | sigs["copy"] and join.src[-2:] == tuple(resets)


def test_kernargs_lower_bufferize_patches_and_callify(dev):
  calls, mid, _ = _chain(dev, gs=(Variable("n", 1, 2), 1, 1))
  keep = []
  _, ctx = run_pipeline(dev, linear_of(dev, calls), keep=keep)
  st = dict(keep)
  ka = next(u for u in st["kernargs"].src if u.op is Ops.KERNARGS)
  assert [off for off, _ in ka.arg.regions] == [0, 256] and ka.arg.size == 512  # 20-byte regions, 256-byte aligned
  assert all(u.op in (Ops.QUEUE, Ops.PACKET, Ops.INDIRECT, Ops.KERNARGS) or u.op not in
             (Ops.EXEC, Ops.XFER, Ops.WAIT, Ops.SIGNAL, Ops.MEMBAR) for u in st["lower"].toposort())
  bufs = [u for u in st["bufferize"].src if u.op in (Ops.CMDBUF, Ops.KERNARGS)]
  assert sorted(u.op.name for u in bufs) == ["CMDBUF", "CMDBUF", "KERNARGS"]  # a command buffer per engine
  patches = [p for u in st["patches"].src if u.op in (Ops.CMDBUF, Ops.KERNARGS) for p in u.src if p.op is Ops.PATCH]
  # what changes between replays: input 0 (kernel 1's source), input 1 (kernel 2's output), k twice (one per
  # kernel), and kernel 2's launch size n (dword 25: after exec, signal, wait, barrier and 4 dwords of exec)
  what = sorted(p.arg.what for p in patches)
  assert what == ["compute dword 25", "scale0 buffer 1", "scale0 k", "scale1 buffer 0", "scale1 k"], what
  src = st["callify"].arg
  assert src.count("if x != L[") == 4  # input 0, input 1, k (two fields, one compare), n
  assert "D.next_timeline()" in src and src.count("S0(") == 1 and src.count("S1(") == 1
  assert ctx.fn is not None


def test_replays_run_kernel_copy_kernel_with_new_inputs_values_and_sizes(dev):
  calls, mid, mid2 = _chain(dev, gs=(Variable("n", 1, 2), 1, 1))
  graph = HCQ2Graph(dev, calls)
  for rep, (k, n) in enumerate(((3, 2), (5, 1), (-2, 2))):
    x, out = dev._gpu_alloc(32), dev._gpu_alloc(32)
    xs = [float(i + rep) for i in range(8)]
    put(x, xs)
    put(out, [0.0] * 8)
    graph([x, out], {"k": k, "n": n})
    dev.synchronize()
    assert floats(mid) == [v * k for v in xs]
    assert floats(out) == [v * k * k for v in xs[:4 * n]] + [0.0] * (8 - 4 * n)
    assert dev.timeline_signal.value == rep + 1 == graph.last_signal
    assert all(s.value == 0 for s in graph.ctx.signals)  # the join reset the queue signals for the next replay
  assert [e for e in dev.gpu.log] == [("compute", "exec"), ("copy", "copy"), ("compute", "exec")] * 3


def test_unchanged_replay_writes_nothing_and_does_not_wait(dev):
  calls, _, _ = _chain(dev)
  graph = HCQ2Graph(dev, calls)
  x, out = dev._gpu_alloc(32), dev._gpu_alloc(32)
  put(x, [1.0] * 8)
  graph([x, out], {"k": 2})
  waits = []
  dev.timeline_signal.wait = lambda v, timeout_ms=0: waits.append(v)  # record instead of running the GPU
  graph([x, out], {"k": 2})
  graph([x, out], {})  # k keeps its capture value 3... which differs from 2: a patch, so it waits for replay 2
  assert waits == [2]
  del dev.timeline_signal.wait
  dev.synchronize()
  assert floats(out) == [9.0] * 8


def test_launch_sizes_a_device_only_knows_at_replay(dev):
  # sizes that aren't UOps (the contract allows any symbolic value): HCQ2 asks the kernel's `launch` each replay
  mid = dev._gpu_alloc(32)
  graph = HCQ2Graph(dev, [K(Scale(dev, 0), [mid, 0], 2, gs=("g", 1, 1))])
  x = dev._gpu_alloc(32)
  put(x, [1.0] * 8)
  for g in (1, 2):
    put(mid, [0.0] * 8)
    graph([x], {"g": g, "k": 2})
    dev.synchronize()
    assert floats(mid) == [2.0] * (4 * g) + [0.0] * (8 - 4 * g)
  assert "K0.launch(vv)" in graph.source


def test_out_of_range_values_name_their_field(dev):
  calls, _, _ = _chain(dev)
  graph = HCQ2Graph(dev, calls)
  x, out = dev._gpu_alloc(32), dev._gpu_alloc(32)
  put(x, [1.0] * 8)
  with pytest.raises(ValueError, match=r"scale0 k = 2147483648 does not fit its field \(valid -2147483648"):
    graph([x, out], {"k": 1 << 31})
  assert dev.timeline_value == 1  # nothing was submitted nor a timeline value taken: the device stays usable
  graph([x, out], {"k": 2})
  dev.synchronize()
  assert floats(out) == [4.0] * 8


def test_a_device_without_a_copy_queue_copies_on_compute():
  class OneQueue(FakeDevice):  # like Adreno: copies are compute-queue commands, ordered by barriers
    hcq2_copy_engine = "compute"
  d = OneQueue()
  calls, mid, _ = _chain(d)
  keep = []
  run_pipeline(d, linear_of(d, calls), keep=keep)
  (q,) = dict(keep)["deps"].src
  assert [u.op for u in q.src[1:]] == [Ops.EXEC, Ops.MEMBAR, Ops.XFER, Ops.MEMBAR, Ops.EXEC]  # no signal needed
  graph = HCQ2Graph(d, calls)
  assert graph.ctx.signals == [] and "S1(" not in graph.source
  x, out = d._gpu_alloc(32), d._gpu_alloc(32)
  put(x, [2.0] * 8)
  graph([x, out], {})
  d.synchronize()
  assert floats(out) == [18.0] * 8 and d.gpu.log == [("compute", "exec"), ("compute", "copy"), ("compute", "exec")]


def test_a_device_whose_encoder_misses_an_op_is_refused():
  class Partial(FakeDevice):
    pm_lower = PatternMatcher(pm_lower_fake.patterns[:1] + pm_lower_fake.patterns[2:], name="partial")
  d = Partial()
  calls, _, _ = _chain(d)
  with pytest.raises(RuntimeError, match=r"FAKE's pm_lower does not encode \['XFER'\]"): HCQ2Graph(d, calls)


def test_hcq2_0_asks_for_the_removed_imperative_graph_and_is_refused(dev):
  calls, _, _ = _chain(dev)
  with Context(HCQ2=0), pytest.raises(ValueError, match="HCQ2=0 asks for the imperative HCQGraph, which was removed"):
    HCQ2Graph(dev, calls)
  with Context(HCQ2=1): assert HCQ2Graph(dev, calls).source.startswith("def replay(")
