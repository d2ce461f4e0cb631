"""OnnxRunner(jit=True, max_dims=...) with dynamic dims (issue #39): a graph input's `dim_param` (or unknown) dim named
in `max_dims` becomes a bound Variable, so one TinyJit capture (one compile of every kernel) serves every batch /
sequence size. Models exported by torch with `dynamic_axes`, each run at several sizes, checked against
onnxruntime."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tiny_codegen  # noqa: E402
from tiny_tensor.nn.onnx import OnnxRunner  # noqa: E402
from tiny_tensor.nn.onnx.host import is_symbolic  # noqa: E402
nn = torch.nn


class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 3)

  def forward(self, x): return self.b(torch.relu(self.a(x))).softmax(-1)


class ConvNet(nn.Module):
  def __init__(self):
    super().__init__()
    self.c, self.bn, self.f = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4 * 4 * 4, 5)

  def forward(self, x):
    return self.f(torch.flatten(nn.functional.max_pool2d(torch.relu(self.bn(self.c(x))), 2), 1))


class Block(nn.Module):
  """A pre-norm causal self-attention + MLP block, shapes read from the input as GPT-2's export does."""
  def __init__(self, d=16, h=2, max_seq=32):
    super().__init__()
    self.h, self.ln1, self.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
    self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
    self.register_buffer("mask", torch.tril(torch.ones(max_seq, max_seq)).view(1, 1, max_seq, max_seq))

  def forward(self, x):
    b, s, d = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
    q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))  # (B, H, S, D/H)
    att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.h) ** 0.5)
    att = att.masked_fill(self.mask[:, :, :s, :s] == 0, float("-inf")).softmax(-1)
    x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, s, d))
    return x + self.ff(self.ln2(x))


def _export(model, example, axes):
  torch.manual_seed(0)
  f = io.BytesIO()
  torch.onnx.export(model.eval(), (example,), f, input_names=["x"], output_names=["y"], opset_version=17,
                    dynamic_axes={"x": axes, "y": axes}, dynamo=False)
  return onnx.load_from_string(f.getvalue())


@pytest.fixture
def compiles(monkeypatch):
  """Counts kernel compiles (calls of tiny_codegen.get_program, which the engine makes once per new kernel)."""
  n = [0]
  real = tiny_codegen.get_program

  def counting(*a, **k):
    n[0] += 1
    return real(*a, **k)
  monkeypatch.setattr(tiny_codegen, "get_program", counting)
  return n


def _check_one_capture(model, shape_of, sizes, compiles, **kw):
  """Run `model` at each size through one runner; every output equals onnxruntime's, one capture serves all, and
  no kernel is compiled after the first size's two calls (eager, capture)."""
  torch.manual_seed(0)
  sess = ort.InferenceSession(model.SerializeToString())
  run = OnnxRunner(model, jit=True, **kw)
  rng = np.random.default_rng(0)
  after_first = None
  for i, n in enumerate(sizes):
    reps = 2 if i == 0 else 1  # call 1 eager, call 2 captures
    for _ in range(reps):
      x = rng.standard_normal(shape_of(n)).astype(np.float32)
      got = run({"x": x})["y"]
      assert got.shape == sess.run(None, {"x": x})[0].shape
      np.testing.assert_allclose(got.numpy(), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    if i == 0: after_first = compiles[0]
  assert run.symbolic and len(run.jits) == 1
  (fn,) = run.jits.values()
  assert fn.captured is not None
  return after_first, run


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_dynamic_batch_one_capture(name, compiles):
  model, ex, shape_of = {"mlp": (MLP(), torch.randn(2, 6), lambda n: (n, 6)),
                         "conv": (ConvNet(), torch.randn(2, 3, 8, 8), lambda n: (n, 3, 8, 8))}[name]
  m = _export(model, ex, {0: "batch"})
  sizes = [3, 5, 1, 8, 2]
  runs: list = []
  _check_one_capture(m, shape_of, sizes[:1], compiles, max_dims={"batch": 8})
  first = compiles[0]
  _, run = _check_one_capture(m, shape_of, sizes, compiles, max_dims={"batch": 8})
  runs.append(run)
  # the second runner found every kernel compiled: its later sizes replay them (no compile at all)
  assert compiles[0] == first, f"{compiles[0] - first} kernels compiled again for new batch sizes"


def test_dynamic_seq_transformer_block_one_capture(compiles):
  m = _export(Block(), torch.randn(1, 5, 16), {1: "seq"})
  before = compiles[0]
  after_first, run = _check_one_capture(m, lambda n: (1, n, 16), [4, 7, 1, 12, 3], compiles, max_dims={"seq": 32})
  assert after_first > before and compiles[0] == after_first, "kernels compiled again for new sequence lengths"
  assert run.max_dims == {"seq": 32}


def test_repeated_and_alternating_sizes_replay_their_own_values():
  """A size seen before reuses what its last call derived (the staged inputs, the jit's key and Variable values, the
  outputs' views): new values at every call, sizes back and forth, one array refilled in place, must all come out
  as onnxruntime computes them."""
  m = _export(Block(), torch.randn(1, 5, 16), {1: "seq"})
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"seq": 32})
  rng = np.random.default_rng(4)
  held = None
  for i, n in enumerate([4, 4, 7, 7, 4, 7, 7, 1, 4, 4]):
    x = rng.standard_normal((1, n, 16)).astype(np.float32)
    if i == 9: held[:] = x; x = held  # noqa: E702  (the last call's array, refilled in place)
    got = run({"x": x})["y"]
    assert got.shape == (1, n, 16)
    np.testing.assert_allclose(got.numpy(), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    held = x
  assert run.symbolic and len(run.jits) == 1


def test_sizes_above_max_dims_get_a_capture_of_their_own():
  m = _export(MLP(), torch.randn(2, 6), {0: "batch"})
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"batch": 4})
  for n in (3, 2, 6, 6, 4):
    x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
  assert len(run.jits) == 2  # one symbolic (batch in [1, 4]), one for batch 6


def _run_sizes(m, sizes, shape_of, **kw):
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, **kw)
  for n in sizes:
    x = np.random.default_rng(hash(n) % 1000).standard_normal(shape_of(n)).astype(np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), sess.run(None, {"x": x})[0], rtol=1e-6)
  return run


def test_symbolic_host_shape_arithmetic():
  """Shape -> Gather -> Mul/Div -> Concat -> Reshape (with -1) on two dynamic dims, Expand to shape values and a
  Slice to s - 1, as torch exports them: the host carries the sizes symbolically, one capture serves all sizes."""
  class M(nn.Module):
    def forward(self, x):
      b, s = x.shape[0], x.shape[1]
      y = x.reshape(b * s, x.shape[2] * 2 // 2) + 1.0
      return y.reshape(b, -1, 3).expand(b, s, 3)[:, : s - 1] * 2
  m = _export(M(), torch.randn(2, 4, 3), {0: "b", 1: "s"})
  run = _run_sizes(m, [(2, 4), (2, 4), (3, 6), (1, 2), (5, 7)], lambda bs: (*bs, 3), max_dims={"b": 8, "s": 8})
  assert run.symbolic and len(run.jits) == 1


def test_reshape_not_provably_the_same_size_falls_back():
  """(b, s, 3) -> (b*s//2, 6) is the same size only for even b*s: not for every value of the Variables, so the
  runner captures per size (the answers are still onnxruntime's)."""
  class M(nn.Module):
    def forward(self, x): return x.reshape(x.shape[0] * x.shape[1] // 2, 6) + 1.0
  m = _export(M(), torch.randn(2, 4, 3), {0: "b", 1: "s"})
  run = _run_sizes(m, [(2, 4), (2, 4), (3, 6), (1, 2)], lambda bs: (*bs, 3), max_dims={"b": 8, "s": 8})
  assert not run.symbolic and len(run.jits) == 3


def test_operator_without_symbolic_support_falls_back_per_size(capsys):
  """Trilu over a dynamic (S, S) mask can't run symbolically: the runner says which node and captures per size,
  with the right answers."""
  class M(nn.Module):
    def forward(self, x): return x + torch.triu(torch.ones(x.shape[1], x.shape[1]), 1)
  m = _export(M(), torch.randn(1, 3, 3), {1: "s", 2: "s"})
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"s": 8})
  from tiny_uop.helpers import Context
  with Context(DEBUG=1):
    x = np.ones((1, 3, 3), np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), sess.run(None, {"x": x})[0])
  assert "Trilu" in capsys.readouterr().out
  for s in (3, 4, 2):
    x = np.random.default_rng(s).standard_normal((1, s, s)).astype(np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), sess.run(None, {"x": x})[0], rtol=1e-6)
  assert not run.symbolic and len(run.jits) == 3


def test_symbolic_values_helper():
  from tiny_uop import Variable
  from tiny_tensor.nn.onnx.host import sym_array
  v = Variable("n", 1, 8).bind(3)
  assert is_symbolic(sym_array([v, 4])) and not is_symbolic(sym_array([4, 5]))
  assert sym_array([v * 0 + 2, 4]).dtype == np.int64  # an expression that folds to a constant is an int again


def test_without_max_dims_each_size_gets_its_own_capture():
  """Symbolic dims are opt-in: kernels compiled for symbolic sizes run slower than ones for a fixed size (the CPU
  heuristics count a symbolic bound as 1), so without max_dims a dynamic dim keeps one capture per size."""
  m = _export(MLP(), torch.randn(2, 6), {0: "batch"})
  run = _run_sizes(m, [2, 2, 3, 3], lambda n: (n, 6))
  assert not run.symbolic and len(run.jits) == 2
  # and a dim max_dims doesn't name stays concrete too
  run = _run_sizes(m, [2, 2, 3, 3], lambda n: (n, 6), max_dims={"seq": 8})
  assert len(run.jits) == 2


def test_bad_max_dims():
  m = _export(MLP(), torch.randn(2, 6), {0: "batch"})
  with pytest.raises(ValueError, match="max_dims"): OnnxRunner(m, jit=True, max_dims={"batch": 0})
  with pytest.raises(ValueError, match="max_dims"): OnnxRunner(m, jit=True, max_dims={"batch": "64"})


def test_symbolic_equal_where_max_div_on_shape_values():
  """Host shape ops on symbolic values, in a graph written with onnx.helper: Equal(shape, -1) -> Where (torch's
  export of expand(-1, ...)), Max(shape, 1), Div(seq, 1) with Less/GreaterOrEqual decided by the Variables' ranges;
  checked against onnxruntime at several sizes under one capture."""
  from onnx import TensorProto, helper
  c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64,  # noqa
                                                                                              [len(v)], v))
  nodes = [
    helper.make_node("Shape", ["x"], ["s"]),                          # [b, n]
    c("m1", [-1, -1]), c("one", [1]), c("two", [1, 1]), c("zero", [0, 0]),
    helper.make_node("Equal", ["s", "m1"], ["eq"]),                   # [False, False]
    helper.make_node("Where", ["eq", "two", "s"], ["s2"]),            # [b, n]
    helper.make_node("Max", ["s2", "one"], ["s3"]),                   # [b, n]
    helper.make_node("Div", ["s3", "one"], ["s4"]),                   # [b, n]
    helper.make_node("Less", ["s4", "zero"], ["neg"]),                # [False, False]
    helper.make_node("GreaterOrEqual", ["s4", "one"], ["pos"]),       # [True, True]
    helper.make_node("Where", ["neg", "zero", "s4"], ["s5"]),         # [b, n]
    helper.make_node("Where", ["pos", "s5", "zero"], ["s6"]),         # [b, n]
    helper.make_node("Mul", ["s6", "two"], ["s7"]),
    helper.make_node("Expand", ["row", "s7"], ["e"]),                 # (n,) -> (b, n)
    helper.make_node("Add", ["x", "e"], ["y"]),
  ]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"]),
                                     helper.make_tensor_value_info("row", TensorProto.FLOAT, ["n"])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "n"])])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"b": 16, "n": 16})
  rng = np.random.default_rng(1)
  for b, n in ((2, 3), (2, 3), (4, 5), (1, 1), (16, 2)):
    feed = {"x": rng.standard_normal((b, n)).astype(np.float32), "row": rng.standard_normal(n).astype(np.float32)}
    np.testing.assert_allclose(run(feed)["y"].numpy(), sess.run(None, feed)[0], rtol=1e-6)
  assert run.symbolic and len(run.jits) == 1


def test_unknown_dim_is_named_input_dot_index():
  """A dim the model leaves unknown (no dim_value, no dim_param) is named "<input>.<i>" in max_dims."""
  from onnx import TensorProto, helper
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
  w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], np.arange(8, dtype=np.float32).tolist())
  g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])], [w])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  run = _run_sizes(m, [3, 3, 5, 1], lambda n: (n, 4), max_dims={"x.0": 8})
  assert run.symbolic and len(run.jits) == 1


def test_gather_along_a_symbolic_axis_and_its_index_check():
  """Gather with runtime indices along a dynamic dim (GPT-2's padding-mask lookup): one capture for every size, the
  values onnxruntime's (negative indices too), and an index past this call's size still refused after the run."""
  from onnx import TensorProto, helper
  from tiny_tensor.nn.onnx import OnnxError
  g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "g",
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
                         helper.make_tensor_value_info("i", TensorProto.INT64, ["k"])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k", 3])])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"n": 8, "k": 8})
  rng = np.random.default_rng(2)
  for n, k in ((4, 2), (4, 2), (7, 5), (1, 1), (8, 8)):
    feed = {"x": rng.standard_normal((n, 3)).astype(np.float32), "i": rng.integers(-n, n, k).astype(np.int64)}
    np.testing.assert_array_equal(run(feed)["y"].numpy(), sess.run(None, feed)[0])
  assert run.symbolic and len(run.jits) == 1
  with pytest.raises(OnnxError, match=r"index value\(s\) out of range, e.g. 5 \(valid: \[-5, 4\]"):
    run({"x": np.zeros((5, 3), np.float32), "i": np.array([0, 5], np.int64)})


def test_subgraph_under_symbolic_sizes_falls_back():
  """An If whose branch reads a symbolic-shaped outer value: subgraphs don't run symbolically, so the runner falls
  back to a capture per size (the answers are onnxruntime's)."""
  from onnx import TensorProto, helper
  one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
  branch = lambda name, op: helper.make_graph(  # noqa: E731
    [helper.make_node(op, ["x", "c1"], [f"{name}_y"])], name, [],
    [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["n", 2])])
  nodes = [helper.make_node("Constant", [], ["c1"], value=one),
           helper.make_node("If", ["cond"], ["y"], then_branch=branch("t", "Add"), else_branch=branch("e", "Sub"))]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
                        [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  sess = ort.InferenceSession(m.SerializeToString())
  run = OnnxRunner(m, jit=True, max_dims={"n": 8})
  for n in (2, 2, 3, 3):
    x = np.random.default_rng(n).standard_normal((n, 2)).astype(np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), sess.run(None, {"x": x})[0], rtol=1e-6)
  assert not run.symbolic and len(run.jits) == 2


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
                                "GreaterOrEqual"])
def test_host_symbolic_binary_ops_against_every_value(op):
  """host.py's arithmetic and comparisons on a symbolic shape vector [n, 4] with n in [2, 8], against numpy on the
  concrete vector for every value of n: an answer it gives holds for all of them (None: it can't, the runner falls
  back)."""
  from tiny_uop import Variable
  from tiny_tensor.nn.onnx.host import _sym_binary, sym_array
  ref = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": lambda a, b: np.trunc(a / b).astype(np.int64),
         "Max": np.maximum, "Min": np.minimum, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
         "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal}[op]
  var = Variable("n", 2, 8)
  decided = 0
  for other in ([1, 4], [2, 3], [9, 4], [8, 2]):
    for sym_first in (True, False):
      s = sym_array([var.bind(2), 4])
      o = np.array(other, np.int64)
      got = _sym_binary(op, [s, o] if sym_first else [o, s])
      if got is None: continue
      decided += 1
      for n in range(2, 9):
        want = ref(*([np.array([n, 4]), o] if sym_first else [o, np.array([n, 4])]))
        val = [int(x.substitute({u: u.src[0] for u in x.toposort() if u.op.name == "BIND"}).sym_infer({"n": n}))
               if hasattr(x, "sym_infer") else x for x in got.tolist()]
        np.testing.assert_array_equal(np.array(val), want, err_msg=f"{op} {other} sym_first={sym_first} n={n}")
  assert decided >= 4  # most pairs are decided (Div by a symbolic size and undecidable comparisons aren't)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_dynamic_seq_hf_transformers_match_onnxruntime(kind, compiles):
  """transformers' BERT and GPT-2 exported with a dynamic sequence, one capture for every length (issue #39): the
  scores' keys are masked vectors over the sequence (tails of 1 and of lanes - 1 at 17 and 31 tokens, whatever the
  vector width), GPT-2's position ids a one-hot gather over it; each length against onnxruntime."""
  pytest.importorskip("transformers")
  from transformers import BertConfig, BertModel, GPT2Config, GPT2Model
  torch.manual_seed(0)
  if kind == "bert":
    m = BertModel(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64))
  else: m = GPT2Model(GPT2Config(vocab_size=60, n_embd=32, n_layer=1, n_head=2, n_positions=64))

  class LastHidden(nn.Module):
    def __init__(self):
      super().__init__()
      self.m = m

    def forward(self, ids, mask):  # (no key/value cache: its Concat can't take a symbolic shape)
      kw = {"use_cache": False} if kind == "gpt2" else {}
      return self.m(input_ids=ids, attention_mask=mask, **kw).last_hidden_state
  ids = torch.randint(0, 60, (1, 64))  # traced at the longest length (transformers' mask code branches on it)
  f = io.BytesIO()
  torch.onnx.export(LastHidden().eval(), (ids, torch.ones_like(ids)), f, input_names=["ids", "mask"],
                    output_names=["y"], opset_version=17, dynamo=False,
                    dynamic_axes={"ids": {1: "seq"}, "mask": {1: "seq"}, "y": {1: "seq"}})
  model = onnx.load_from_string(f.getvalue())
  sess = ort.InferenceSession(model.SerializeToString())
  run = OnnxRunner(model, jit=True, max_dims={"seq": 64})
  rng = np.random.default_rng(7)
  after_first = None
  for i, n in enumerate([17, 1, 31, 8, 64, 33]):
    for _ in range(2 if i == 0 else 1):
      feeds = {"ids": rng.integers(0, 60, (1, n)).astype(np.int64), "mask": np.ones((1, n), np.int64)}
      np.testing.assert_allclose(run(feeds)["y"].numpy(), sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                 err_msg=f"{kind} at {n} tokens")
    if i == 0: after_first = compiles[0]
  assert len(run.jits) == 1 and compiles[0] == after_first, "kernels compiled again for new sequence lengths"
