"""OnnxRunner(jit=True): graphs that compute shapes (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) keep those
values on the host, so they run under TinyJit; outputs are checked against numpy and torch, and a replay must not
re-capture or change its kernel count."""
import math

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tiny_tensor import Tensor
from tiny_tensor.jit import TinyJit
from tiny_tensor.nn.onnx import OnnxError, OnnxRunner

F, I64 = TensorProto.FLOAT, TensorProto.INT64
H, D = 2, 8  # heads, model width


def _model(nodes, inputs, outputs, inits=(), opset=17):
  g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _c(name, value): return numpy_helper.from_array(np.asarray(value), name)


def _heads_nodes(x, out, prefix):
  """(B, T, D) -> (B, H, T, D/H) through a reshape whose target is computed from Shape(x)."""
  n = helper.make_node
  return [n("Shape", [x], [f"{prefix}s"]),
          n("Gather", [f"{prefix}s", "i0"], [f"{prefix}b"], axis=0),
          n("Gather", [f"{prefix}s", "i1"], [f"{prefix}t"], axis=0),
          n("Unsqueeze", [f"{prefix}b", "ax0"], [f"{prefix}bu"]),
          n("Unsqueeze", [f"{prefix}t", "ax0"], [f"{prefix}tu"]),
          n("Concat", [f"{prefix}bu", f"{prefix}tu", "heads", "hd"], [f"{prefix}shape"], axis=0),
          n("Reshape", [x, f"{prefix}shape"], [f"{prefix}r"]),
          n("Transpose", [f"{prefix}r"], [out], perm=[0, 2, 1, 3])]


def _attention_nodes(q, k, v, out, mask=None):
  """Scaled dot-product attention on (B, H, T, hd); the scale is sqrt(hd) computed from Shape(q) in float."""
  n = helper.make_node
  nodes = [n("Shape", [q], ["qs"]), n("Gather", ["qs", "i3"], ["hdi"], axis=0),
           n("Cast", ["hdi"], ["hdf"], to=F), n("Sqrt", ["hdf"], ["scale"]),
           n("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", [q, "kt"], ["qk"]),
           n("Div", ["qk", "scale"], ["sc"])]
  if mask is not None: nodes += [n("Where", [mask, "sc", "ninf"], ["scm"])]
  nodes += [n("Softmax", ["scm" if mask is not None else "sc"], ["p"], axis=-1), n("MatMul", ["p", v], ["a"]),
            n("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
            n("Shape", ["at"], ["as"]), n("Slice", ["as", "s0", "s2"], ["bt"]),       # [B, T]
            n("Concat", ["bt", "dm"], ["oshape"], axis=0), n("Reshape", ["at", "oshape"], [out])]
  return nodes


def _common_inits(rng):
  return [_c("i0", np.int64(0)), _c("i1", np.int64(1)), _c("i3", np.int64(3)), _c("ax0", np.array([0], np.int64)),
          _c("heads", np.array([H], np.int64)), _c("hd", np.array([D // H], np.int64)),
          _c("s0", np.array([0], np.int64)), _c("s2", np.array([2], np.int64)), _c("dm", np.array([D], np.int64)),
          _c("wq", rng.standard_normal((D, D)).astype(np.float32)),
          _c("wk", rng.standard_normal((D, D)).astype(np.float32)),
          _c("wv", rng.standard_normal((D, D)).astype(np.float32))]


def _bert_like():
  """x (B, T, D) -> one self-attention layer, every reshape target computed from shapes."""
  rng = np.random.default_rng(0)
  n = helper.make_node
  nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("MatMul", ["x", "wk"], ["k0"]), n("MatMul", ["x", "wv"], ["v0"])]
  for p in "qkv": nodes += _heads_nodes(f"{p}0", p, f"{p}_")
  nodes += _attention_nodes("q", "k", "v", "y")
  inits = _common_inits(rng)
  return _model(nodes, [helper.make_tensor_value_info("x", F, ["B", "T", D])],
                [helper.make_tensor_value_info("y", F, None)], inits), {i.name: numpy_helper.to_array(i) for i in inits}


def _gpt_like():
  """ids (B, T) -> token + position embeddings (positions by Range over Shape), causal attention whose mask comes
  from Range/Unsqueeze/LessOrEqual on the sequence length."""
  rng = np.random.default_rng(1)
  n = helper.make_node
  nodes = [n("Gather", ["wte", "ids"], ["te"]), n("Shape", ["ids"], ["is"]), n("Gather", ["is", "i1"], ["T"]),
           n("Range", ["zero", "T", "one"], ["pos"]), n("Gather", ["wpe", "pos"], ["pe"]),
           n("Add", ["te", "pe"], ["x"]),
           n("Unsqueeze", ["pos", "ax0"], ["row"]), n("Unsqueeze", ["pos", "ax1"], ["col"]),
           n("LessOrEqual", ["row", "col"], ["mask"]),
           n("MatMul", ["x", "wq"], ["q0"]), n("MatMul", ["x", "wk"], ["k0"]), n("MatMul", ["x", "wv"], ["v0"])]
  for p in "qkv": nodes += _heads_nodes(f"{p}0", p, f"{p}_")
  nodes += _attention_nodes("q", "k", "v", "y", mask="mask")
  inits = _common_inits(rng) + [
    _c("wte", rng.standard_normal((50, D)).astype(np.float32)),
    _c("wpe", rng.standard_normal((16, D)).astype(np.float32)),
    _c("zero", np.int64(0)), _c("one", np.int64(1)), _c("ax1", np.array([1], np.int64)),
    _c("ninf", np.float32(-1e9))]
  return _model(nodes, [helper.make_tensor_value_info("ids", I64, ["B", "T"])],
                [helper.make_tensor_value_info("y", F, None)], inits), {i.name: numpy_helper.to_array(i) for i in inits}


def _np_attention(x, w, mask=None):
  b, t, _ = x.shape
  q, k, v = ((x @ w[m]).reshape(b, t, H, D // H).transpose(0, 2, 1, 3) for m in ("wq", "wk", "wv"))
  s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D // H)
  if mask is not None: s = np.where(mask, s, np.float32(-1e9))
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return (p @ v).transpose(0, 2, 1, 3).reshape(b, t, D)


def _np_gpt(ids, w):
  t = ids.shape[1]
  x = w["wte"][ids] + w["wpe"][np.arange(t)]
  return _np_attention(x, w, np.arange(t)[None, :] <= np.arange(t)[:, None])


def test_bert_like_shape_chain_runs_under_jit_like_eager_and_numpy():
  m, w = _bert_like()
  eager, jit = OnnxRunner(m), OnnxRunner(m, jit=True)
  rng = np.random.default_rng(2)
  for _ in range(4):
    x = rng.standard_normal((2, 5, D)).astype(np.float32)
    want = _np_attention(x, w)
    np.testing.assert_allclose(eager({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jit({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-5)
  (fn,) = jit.jits.values()
  assert fn.captured is not None and fn.cnt == 4


def test_gpt_like_shape_chain_runs_under_jit_and_replays_without_recapture():
  m, w = _gpt_like()
  run = OnnxRunner(m, jit=True)
  rng = np.random.default_rng(3)
  kernels, captured = None, None
  for i in range(5):
    ids = rng.integers(0, 50, (2, 6)).astype(np.int64)
    np.testing.assert_allclose(run({"ids": ids})["y"].numpy(), _np_gpt(ids, w), rtol=1e-4, atol=1e-5)
    (fn,) = run.jits.values()
    if i >= 1:  # call 2 captured; replays keep that very capture and its kernel count
      if captured is None: captured, kernels = fn.captured, fn.captured.kernel_count
      assert fn.captured is captured and fn.captured.kernel_count == kernels
  assert fn.cnt == 5 and kernels > 0
  # another sequence length: a capture of its own, the first one untouched
  ids = rng.integers(0, 50, (1, 9)).astype(np.int64)
  for _ in range(3): np.testing.assert_allclose(run({"ids": ids})["y"].numpy(), _np_gpt(ids, w), rtol=1e-4, atol=1e-5)
  assert len(run.jits) == 2 and captured.kernel_count == kernels


def test_shape_chain_under_a_users_tinyjit_reads_no_device_data():
  """Before shapes stayed on the host, Reshape read its Shape-computed target back: TinyJit refused the capture."""
  m, w = _bert_like()
  run = OnnxRunner(m)
  step = TinyJit(lambda x: run({"x": x})["y"].realize())
  rng = np.random.default_rng(4)
  for _ in range(4):
    x = rng.standard_normal((3, 4, D)).astype(np.float32)
    np.testing.assert_allclose(step(Tensor(x)).numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)


def test_runtime_index_checks_work_under_jit():
  m, w = _gpt_like()
  run = OnnxRunner(m, jit=True)  # runtime_index_checks=True: the jit returns the check and the runner reads it
  ok = np.array([[1, 2, 3]], np.int64)
  for _ in range(3): np.testing.assert_allclose(run({"ids": ok})["y"].numpy(), _np_gpt(ok, w), rtol=1e-4, atol=1e-5)
  with pytest.raises(OnnxError, match=r"index value\(s\) out of range, e.g. 50 \(valid: \[-50, 49\]"):
    run({"ids": np.array([[1, 50, 3]], np.int64)})  # a replay
  np.testing.assert_allclose(run({"ids": ok})["y"].numpy(), _np_gpt(ok, w), rtol=1e-4, atol=1e-5)


def test_numpy_inputs_refill_the_replays_inputs_every_call():
  """A jitted runner copies each call's numpy inputs into the Tensors its capture reads (no new Tensor per call):
  every call must see its own values, also when the caller refills one array in place or mixes in a Tensor, and a
  runner called from two threads at once must not hand one thread's inputs to the other."""
  import threading
  m, w = _bert_like()
  run = OnnxRunner(m, jit=True)
  rng = np.random.default_rng(5)
  x = rng.standard_normal((2, 5, D)).astype(np.float32)
  for i in range(5):
    if i == 3: x[:] = rng.standard_normal(x.shape).astype(np.float32)  # the same array, refilled in place
    elif i: x = rng.standard_normal((2, 5, D)).astype(np.float32)
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)
  assert len(run.jits) == 1
  t = Tensor(rng.standard_normal((2, 5, D)).astype(np.float32))  # a Tensor input is read as it is
  np.testing.assert_allclose(run({"x": t})["y"].numpy(), _np_attention(t.numpy(), w), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(run({"x": x})["y"].numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)
  x8 = rng.standard_normal((2, 8, D)).astype(np.float32)  # another shape: a capture and inputs of its own
  for _ in range(3): np.testing.assert_allclose(run({"x": x8})["y"].numpy(), _np_attention(x8, w), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(run({"x": x})["y"].numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)
  bad: list[str] = []

  def worker(seed: int) -> None:
    r = np.random.default_rng(seed)
    for _ in range(6):
      xi = r.standard_normal((2, 5, D)).astype(np.float32)
      got = run({"x": xi})["y"].numpy()
      if not np.allclose(got, _np_attention(xi, w), rtol=1e-4, atol=1e-5): bad.append(f"thread {seed}")
  threads = [threading.Thread(target=worker, args=(s,)) for s in (10, 11)]
  for th in threads: th.start()
  for th in threads: th.join()
  assert bad == []


def test_replays_of_one_signature_copy_each_input_once_and_match_the_full_path(monkeypatch):
  """From the first replay on, a call with the inputs of the last one's shapes and dtypes copies each numpy input
  straight into its staged buffer (one copy-in of exactly its bytes, nothing else) and replays: the outputs must be
  bit-identical to the full path's, a held .numpy() must not change with the next call, a non-contiguous or refilled
  array must be read as it is, and inputs of another dtype, shape or name must still be refused as before."""
  from tiny_uop.device import Buffer
  m, w = _bert_like()
  fast, full = OnnxRunner(m, jit=True), OnnxRunner(m, jit=True)
  rng = np.random.default_rng(9)
  xs = [rng.standard_normal((2, 5, D)).astype(np.float32) for _ in range(6)]
  xs[4] = np.asfortranarray(xs[4])  # not C-contiguous: copied contiguous first
  xs[5] = rng.standard_normal((2, 10, D)).astype(np.float32)[:, ::2]  # a strided view
  held = []
  for i, x in enumerate(xs):
    got = fast({"x": x})["y"].numpy()
    full._call.fast = None  # (the reference runner always takes the full path)
    want = full({"x": x})["y"].numpy()
    assert got.tobytes() == want.tobytes(), f"call {i + 1}"
    np.testing.assert_allclose(got, _np_attention(np.ascontiguousarray(x), w), rtol=1e-4, atol=1e-5)
    held.append((got, got.copy()))
  for i, (got, before) in enumerate(held): assert got.tobytes() == before.tobytes(), f"call {i + 1}'s output changed"
  assert fast._call.fast is not None and len(fast.jits) == 1
  copies: list[int] = []
  orig = Buffer.copyin
  monkeypatch.setattr(Buffer, "copyin", lambda self, mv: (copies.append(memoryview(mv).nbytes), orig(self, mv))[1])
  x = rng.standard_normal((2, 5, D)).astype(np.float32)
  out = fast({"x": x})["y"]
  assert copies == [x.nbytes]  # the input's bytes, once; the output stays in the jit's buffer until read
  np.testing.assert_allclose(out.numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)
  monkeypatch.setattr(Buffer, "copyin", orig)
  # the returned Tensor is the jit's own (OnnxRunner's doc): the next call of the signature overwrites it
  x2 = rng.standard_normal((2, 5, D)).astype(np.float32)
  fast({"x": x2})
  np.testing.assert_allclose(out.numpy(), _np_attention(x2, w), rtol=1e-4, atol=1e-5)
  with pytest.raises(TypeError, match=r"'x' is declared tensor\(float\), but an array of float64"):
    fast({"x": x2.astype(np.float64)})
  with pytest.raises(ValueError, match=r"'x' is declared with shape \[B, T, 8\], but one of shape \[2, 5, 4\]"):
    fast({"x": x2[..., :4]})
  with pytest.raises(KeyError, match=r"unknown ONNX input\(s\) \['z'\]"): fast({"x": x2, "z": x2})
  with pytest.raises(KeyError, match=r"ONNX input 'x' is missing"): fast({})
  (fn,) = fast.jits.values()
  fn.reset()  # a reset jit runs and captures again through the full path
  for _ in range(3): np.testing.assert_allclose(fast({"x": x})["y"].numpy(), _np_attention(x, w), rtol=1e-4, atol=1e-5)
  fast.jits.clear()  # frees the captures and, on the next call, the staged inputs
  for _ in range(4):
    np.testing.assert_allclose(fast({"x": x2})["y"].numpy(), _np_attention(x2, w), rtol=1e-4, atol=1e-5)
  assert fast._call.fast is not None and fast._call.fast[1][0] is next(iter(fast._call.staging.values()))


def test_jit_refuses_inputs_it_cant_capture():
  m = _model([helper.make_node("Identity", ["s"], ["y"])],
             [helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
             [helper.make_tensor_value_info("y", TensorProto.STRING, [1])])
  with pytest.raises(TypeError, match=r"jit=True.*'s'.*jit=False"): OnnxRunner(m, jit=True)({"s": np.array(["a"])})
  # the declared element type and shape are checked on every call, replays included
  run = OnnxRunner(_bert_like()[0], jit=True)
  for _ in range(3): run({"x": np.zeros((1, 2, D), np.float32)})
  with pytest.raises(TypeError, match=r"'x' is declared tensor\(float\), but an array of float64"):
    run({"x": np.zeros((1, 2, D))})
  with pytest.raises(ValueError, match=r"'x' is declared with shape \[B, T, 8\], but one of shape \[1, 2, 4\]"):
    run({"x": np.zeros((1, 2, 4), np.float32)})


class _TorchBlock(torch.nn.Module):
  """A tiny transformer block whose head split reshapes by sizes read at run time (x.shape), so an export with dynamic
  axes keeps Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains in the graph."""

  def __init__(self):
    super().__init__()
    self.qkv, self.proj, self.ln = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D), torch.nn.LayerNorm(D)

  def forward(self, x):
    b, t, _ = x.shape
    q, k, v = self.qkv(self.ln(x)).split(D, dim=-1)
    q, k, v = (z.reshape(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    a = s.masked_fill(~causal, float("-inf")).softmax(-1) @ v
    return x + self.proj(a.transpose(1, 2).reshape(b, t, D))


def test_torch_exported_block_with_dynamic_axes_runs_under_jit(tmp_path):
  torch.manual_seed(0)
  mod = _TorchBlock().eval()
  path = tmp_path / "block.onnx"
  torch.onnx.export(mod, (torch.randn(2, 5, D),), str(path), input_names=["x"], output_names=["y"],
                    dynamic_axes={"x": {0: "B", 1: "T"}}, dynamo=False, opset_version=17)
  import onnx
  ops = {n.op_type for n in onnx.load(str(path)).graph.node}
  assert {"Shape", "Gather", "Concat", "Reshape"} <= ops, ops  # the chains under test are there
  run = OnnxRunner(path, jit=True)
  rng = np.random.default_rng(5)
  for shape in [(2, 5, D)] * 4 + [(1, 7, D)] * 3:
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad(): want = mod(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-5)
  assert len(run.jits) == 2 and all(fn.captured is not None for fn in run.jits.values())


def test_a_capture_that_needs_data_on_the_host_says_so():
  # NonZero's output shape depends on the data: no capture can replay it
  m = _model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], [helper.make_tensor_value_info("x", F, [4])],
             [helper.make_tensor_value_info("y", I64, None)])
  run = OnnxRunner(m, jit=True)
  run({"x": np.array([0, 1, 0, 2], np.float32)})
  with pytest.raises(OnnxError, match=r"can't capture this model: node 'nz' \(NonZero\) needs device data on the host"
                                      r": .*reads tensor data.*jit=False"):
    run({"x": np.array([0, 1, 0, 2], np.float32)})


def _hf_tiny(kind):
  """A tiny random transformers BERT or GPT-2 (no download) returning last_hidden_state, and its export inputs."""
  from transformers import BertConfig, BertModel, GPT2Config, GPT2Model
  torch.manual_seed(0)
  if kind == "bert":
    m = BertModel(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=32))
  else: m = GPT2Model(GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=32))

  class LastHidden(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.m = m

    def forward(self, ids, mask):
      # GPT-2 needs the mask given: without one transformers detects packed sequences with aten::diff, which the
      # TorchScript exporter can't export
      return self.m(input_ids=ids, attention_mask=mask).last_hidden_state
  return LastHidden().eval()


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_exported_transformers_run_under_jit_like_transformers(kind, tmp_path):
  """Static-shape exports fold shapes into ConstantOfShape -> Mul -> Equal -> Where -> Expand chains of constants,
  which a jit capture read back from the device before they were computed on the host."""
  mod = _hf_tiny(kind)
  ids = torch.randint(0, 60, (2, 7))
  path = tmp_path / f"{kind}.onnx"
  torch.onnx.export(mod, (ids, torch.ones_like(ids)), str(path), input_names=["ids", "mask"], output_names=["y"],
                    dynamo=False, opset_version=17)
  run = OnnxRunner(path, jit=True)
  rng = np.random.default_rng(6)
  for _ in range(4):
    ids = rng.integers(0, 60, (2, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0  # padding in the second row: the mask is data, not baked into the capture
    with torch.no_grad(): want = mod(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(run({"ids": ids, "mask": mask})["y"].numpy(), want, rtol=1e-4, atol=1e-4)
  (fn,) = run.jits.values()
  assert fn.captured is not None and fn.cnt == 4


def test_bad_shape_arithmetic_on_the_host_names_the_node():
  n = helper.make_node
  m = _model([n("Shape", ["x"], ["s"]), n("Reshape", ["s", "bad"], ["r"], name="fold"),
              n("Reshape", ["x", "r"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 3])],
             [helper.make_tensor_value_info("y", F, None)], [_c("bad", np.array([3], np.int64))])
  with pytest.raises(OnnxError, match=r"node 'fold' \(Reshape, opset 17\) with inputs \[\(2,\), \(1,\)\].*size 2 into "
                                      r"shape \(3,\)"):
    OnnxRunner(m)({"x": np.zeros((2, 3), np.float32)})
  # gathering outside the shape is refused on the host, with the index and the valid range
  m = _model([n("Shape", ["x"], ["s"]), n("Gather", ["s", "i"], ["d"], name="dim"), n("Unsqueeze", ["d", "ax"], ["u"]),
              n("Reshape", ["x", "u"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 3])],
             [helper.make_tensor_value_info("y", F, None)], [_c("i", np.int64(2)), _c("ax", np.array([0], np.int64))])
  with pytest.raises(OnnxError, match=r"node 'dim' \(Gather\): index 2 is out of range \[-2, 1\]"):
    OnnxRunner(m, jit=True)({"x": np.zeros((2, 3), np.float32)})


@pytest.mark.parametrize("t", [5, 300])  # a 5x5 mask is folded on the host; 300x300 exceeds host.HOST_MAX: device
def test_masks_built_from_shapes_match_numpy_under_jit(t):
  n = helper.make_node
  m = _model([n("Shape", ["x"], ["s"]), n("Gather", ["s", "i1"], ["T"]), n("Range", ["zero", "T", "one"], ["pos"]),
              n("Unsqueeze", ["pos", "ax0"], ["row"]), n("Unsqueeze", ["pos", "ax1"], ["col"]),
              n("Less", ["col", "row"], ["future"]), n("Where", ["future", "ninf", "x"], ["y"])],  # i < j
             [helper.make_tensor_value_info("x", F, ["T", "T"])], [helper.make_tensor_value_info("y", F, None)],
             [_c("i1", np.int64(1)), _c("zero", np.int64(0)), _c("one", np.int64(1)),
              _c("ax0", np.array([0], np.int64)), _c("ax1", np.array([1], np.int64)), _c("ninf", np.float32(-1e9))])
  run = OnnxRunner(m, jit=True)
  rng = np.random.default_rng(7)
  for _ in range(3):
    x = rng.standard_normal((t, t)).astype(np.float32)
    np.testing.assert_equal(run({"x": x})["y"].numpy(), np.where(np.triu(np.ones((t, t), bool), 1), -1e9, x))


def test_host_size_limit_counts_the_broadcast_output():
  from tiny_tensor.nn.onnx.host import HOST_MAX, host_can_run
  side = int(HOST_MAX ** 0.5) + 1  # row (1, side) against column (side, 1): side² > HOST_MAX elements out
  row, col = np.zeros((1, side), np.int64), np.zeros((side, 1), np.int64)
  assert not host_can_run("Less", [row, col], {})
  assert host_can_run("Less", [row[:, :8], col[:8]], {})
  assert not host_can_run("Expand", [row, np.array([side, side], np.int64)], {})
  assert host_can_run("Expand", [row[:, :8], np.array([8, 8], np.int64)], {})


class _ShuffleViT(torch.nn.Module):
  """ShuffleNet's channel shuffle and ViT's patchify + class token, with sizes read at run time: exported with a
  dynamic batch they are Shape -> Gather -> Concat -> Reshape/Expand chains (the models the issue couldn't jit)."""

  def __init__(self):
    super().__init__()
    self.conv, self.patch = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, D, 4, stride=4)
    self.cls = torch.nn.Parameter(torch.randn(1, 1, D))

  def forward(self, x):
    y = self.conv(x)
    b, c, h, w = y.shape
    y = y.reshape(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)       # channel shuffle, 2 groups
    p = self.patch(y).flatten(2).transpose(1, 2)                                # (B, patches, D)
    return torch.cat([self.cls.expand(b, -1, -1), p], dim=1)


def test_torch_exported_channel_shuffle_and_patchify_run_under_jit(tmp_path):
  torch.manual_seed(1)
  mod = _ShuffleViT().eval()
  path = tmp_path / "sv.onnx"
  torch.onnx.export(mod, (torch.randn(2, 3, 8, 8),), str(path), input_names=["x"], output_names=["y"],
                    dynamic_axes={"x": {0: "B"}}, dynamo=False, opset_version=17)
  run = OnnxRunner(path, jit=True)
  rng = np.random.default_rng(8)
  for b in (2, 2, 2, 3):
    x = rng.standard_normal((b, 3, 8, 8)).astype(np.float32)
    with torch.no_grad(): want = mod(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-5)
  import onnx
  ops = {n.op_type for n in onnx.load(str(path)).graph.node}
  assert {"Shape", "Gather", "Concat", "Reshape", "Expand"} <= ops, ops  # the chains under test are there
  (sig,) = [k for k in run.jits if k[0][1] == (2, 3, 8, 8)]
  assert run.jits[sig].captured is not None and run.jits[sig].cnt == 3 and len(run.jits) == 2


def test_conv_weights_are_laid_out_once_not_in_every_call():
  """A model's conv weights (initializers) are copied into conv2d's channels-last layout once per runner: a replay
  runs one kernel per conv (its ReLU fused), not a weight copy besides each (efficientnet_b0: 287 -> 206 kernels);
  eager calls reuse the runner's initializers too. Results against onnxruntime, eager and jit."""
  import onnxruntime as ort

  from tiny_tensor.engine import GlobalCounters
  rng = np.random.default_rng(1)
  n = helper.make_node
  inits = [_c("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
           _c("b1", rng.standard_normal(8).astype(np.float32)),
           _c("w2", rng.standard_normal((8, 1, 5, 5)).astype(np.float32)),
           _c("w3", rng.standard_normal((16, 8, 1, 1)).astype(np.float32))]
  m = _model([n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
              n("Conv", ["r1", "w2"], ["c2"], pads=[2, 2, 2, 2], group=8), n("Relu", ["c2"], ["r2"]),
              n("Conv", ["r2", "w3"], ["y"])],
             [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
             [helper.make_tensor_value_info("y", F, [1, 16, 16, 16])], inits)
  x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
  want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  jit, eager = OnnxRunner(m.SerializeToString(), jit=True), OnnxRunner(m.SerializeToString())
  for _ in range(3): np.testing.assert_allclose(jit({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-4)
  GlobalCounters.reset()
  got = jit({"x": x})["y"].numpy()
  assert GlobalCounters.kernel_count == 3, GlobalCounters.kernel_count
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(eager({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-4)
  GlobalCounters.reset()
  np.testing.assert_allclose(eager({"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-4)
  assert GlobalCounters.kernel_count == 3, GlobalCounters.kernel_count
