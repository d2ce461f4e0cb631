"""TinyJit replays on the CPU through its device graph (`tiny_runtime_cpu.graph.CPUGraph`, docs/PIPELINE.md §7):
numbers equal numpy's for chains of dependent kernels, kernels split over shares followed by their consumers,
Variables changing per call, new input buffers per call and an output fed back as the next call's input; each replay
is one native call per run of kernels; JIT=2 replays without a graph and gives the same numbers."""
import numpy as np
import pytest

from tiny_tensor import Tensor, TinyJit
from tiny_uop import Variable
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device
from tiny_runtime_cpu.graph import CPUGraph


def _cpu(a: np.ndarray) -> Tensor: return Tensor(a, device="CPU").realize()


def _graphs(f: TinyJit) -> list:
  return [c for c in f.captured.plan if type(c).__name__ == "_GraphCall"]


def test_cpu_device_has_a_graph() -> None:
  assert Device["CPU"].graph is CPUGraph


def test_chain_of_dependent_kernels_one_native_call_per_replay() -> None:
  @TinyJit
  def f(x: Tensor) -> Tensor:
    for i in range(6): x = (x * 1.5 + i).contiguous()
    return x.realize()
  rng = np.random.default_rng(0)
  for call in range(5):
    a = rng.standard_normal(37).astype(np.float32)
    before = CPUGraph.native_calls
    got = f(_cpu(a)).numpy()
    want = a.copy()
    for i in range(6): want = want * np.float32(1.5) + np.float32(i)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    if call >= 2: assert CPUGraph.native_calls - before == len(_graphs(f)) == 1  # a replay: one native call
  assert len(_graphs(f)[0].kernels) == f.captured.kernel_count == 6


def test_split_kernel_then_its_consumer_and_a_new_input_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
  # an elementwise kernel split over 3 shares (any size splits: no minimum work) then a reduction reading every
  # share's output, itself split
  ren = Device["CPU"].renderer
  monkeypatch.setattr(ren, "threads", 3)
  monkeypatch.setattr(ren, "thread_min_work", 0)

  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor: return ((a * b + 1).contiguous().reshape(64, -1).sum(1) * 2).realize()
  rng = np.random.default_rng(1)
  for _ in range(5):
    a, b = (rng.standard_normal(64 * 96).astype(np.float32) for _ in range(2))
    got = f(_cpu(a), _cpu(b)).numpy()
    want = (a * b + np.float32(1)).reshape(64, -1).astype(np.float64).sum(1) * 2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  (g,) = _graphs(f)
  assert len(g.kernels) == f.captured.kernel_count >= 2 and all(k.global_size[0] > 1 for k in g.kernels)


def test_symbolic_variable_changes_per_call() -> None:
  @TinyJit
  def f(x: Tensor, n: Variable) -> Tensor:
    return ((x * Tensor.from_uop(n, device="CPU").cast(x.dtype)).contiguous() + 1).sum().realize()
  v = Variable("cg_n", 1, 50)
  rng = np.random.default_rng(2)
  for k in (3, 7, 1, 50, 12):
    a = rng.standard_normal(20).astype(np.float32)
    np.testing.assert_allclose(f(_cpu(a), v.bind(k)).numpy(), (a * k + 1).sum(), rtol=1e-5)
  assert _graphs(f)


@pytest.mark.parametrize("split", [False, True])
def test_symbolic_shape_changes_per_call(split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
  if split:  # the symbolic-length kernel split over 3 shares
    monkeypatch.setattr(Device["CPU"].renderer, "threads", 3)
    monkeypatch.setattr(Device["CPU"].renderer, "thread_min_work", 0)

  c = 2.5 if split else 2.0  # different kernels: the unsplit one is cached from the other case

  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x + c).contiguous() * 3).sum().realize()
  v = Variable("cg_len", 1, 64)
  base = np.arange(64, dtype=np.float32)
  for k in (5, 9, 64, 2, 33):
    x = Tensor(base, device="CPU")[:v.bind(k)]
    np.testing.assert_allclose(f(x).numpy(), ((base[:k] + c) * 3).sum(), rtol=1e-6)
  (g,) = _graphs(f)
  assert (g.kernels[0].global_size[0] > 1) == split


def test_output_fed_back_as_next_input() -> None:
  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x * 0.5).contiguous() + 1).realize()
  want = np.linspace(-3, 3, 10).astype(np.float32)
  x = _cpu(want)
  for _ in range(6):
    x = f(x)
    want = want * np.float32(0.5) + np.float32(1)
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("level", [1, 2])
def test_jit_levels(level: int) -> None:
  # JIT=2: kernel by kernel, no graph (tinygrad's meaning); the numbers are the same
  with Context(JIT=level):
    @TinyJit
    def f(x: Tensor) -> Tensor: return ((x + 1).contiguous() * (x - 1)).contiguous().sum().realize()
    a = np.arange(12, dtype=np.float32)
    before = CPUGraph.native_calls
    for _ in range(4): np.testing.assert_allclose(f(_cpu(a)).numpy(), ((a + 1) * (a - 1)).sum(), rtol=1e-6)
    assert bool(_graphs(f)) == (level == 1)
    assert (CPUGraph.native_calls - before == 2) == (level == 1)


def test_the_same_symbolic_inputs_replay_with_their_own_sizes() -> None:
  # a replay given the very inputs of the last one skips re-deriving them (TinyJit's fast path); the Variables their
  # shapes bind come with them: the same views bind the same sizes, a view at another size is another input
  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x + 1).contiguous() * 2).sum().realize()
  v = Variable("fp_len", 1, 64)
  base = np.arange(64, dtype=np.float32)
  views = {k: Tensor(base, device="CPU")[:v.bind(k)] for k in (5, 9)}
  for k in (5, 5, 9, 9, 9, 5, 5, 9):
    np.testing.assert_allclose(f(views[k]).numpy(), ((base[:k] + 1) * 2).sum(), rtol=1e-6)
  assert f._last is not None and f._last[2] == {"fp_len": 9}


def test_mid_size_split_kernel_runs_inline_eagerly_and_on_the_pool_in_a_replay(monkeypatch: pytest.MonkeyPatch) -> None:
  """With the renderer's default `thread_min_work` (sized for a replay's handoff) on 2 threads, row sums of 64 x 2056
  floats (~0.6M units of `kernel_cost`: a few µs, under the Python path's `CPUProgram.python_min_work`) are split in
  2 shares. Run eagerly (scheduled, then replayed by the engine), the launch runs both shares inline
  (`inline_launches` +1); replayed by TinyJit, the graph
  launches them on the pool (no inline launch). The numbers equal numpy's both ways."""
  from tiny_runtime_cpu.cpu import CPUProgram
  ren = Device["CPU"].renderer
  monkeypatch.setattr(ren, "threads", 2)
  assert ren.thread_min_work == type(ren).thread_min_work
  rng = np.random.default_rng(4)
  for _ in range(3):  # scheduled, then the engine's eager replay of its cached schedule (the program's `launcher`)
    a = rng.standard_normal((64, 2056)).astype(np.float32)
    before = CPUProgram.inline_launches
    got = (_cpu(a) * 2).sum(1).numpy()
    np.testing.assert_allclose(got, (a.astype(np.float64) * 2).sum(1), rtol=1e-4, atol=1e-3)
    assert CPUProgram.inline_launches == before + 1

  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x * 2).sum(1) + 1).realize()
  for call in range(4):
    a = rng.standard_normal((64, 2056)).astype(np.float32)
    before, calls = CPUProgram.inline_launches, CPUGraph.native_calls
    got = f(_cpu(a)).numpy()
    np.testing.assert_allclose(got, (a.astype(np.float64) * 2).sum(1) + 1, rtol=1e-4, atol=1e-3)
    if call >= 2: assert CPUProgram.inline_launches == before and CPUGraph.native_calls == calls + 1
  (g,) = _graphs(f)
  assert [k.global_size[0] for k in g.kernels] == [2] and 0 < g.kernels[0].prg.cost < CPUProgram.python_min_work
