"""What the ONNX import makes a transformer's kernels do (issue #39): tanh-GELU's `Pow(x, 3)` multiplies in the
elementwise kernel around it instead of running the general pow, and LayerNormalization's output is stored once
instead of being recomputed (division and square root included) inside the next MatMul. Outputs against
onnxruntime; kernel structure from the jit capture."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiny_tensor.jit import _KernelCall
from tiny_tensor.nn.onnx import OnnxRunner

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT


def _model(nodes, x_shape, y_shape, inits):
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(x_shape))],
                        [helper.make_tensor_value_info("y", F, list(y_shape))],
                        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _run_jit(m, x):
  """The jitted runner's output after its capture and first replay (checked equal), and the captured kernels."""
  run = OnnxRunner(m, jit=True)
  outs = [run({"x": x})["y"].numpy().copy() for _ in range(3)]
  np.testing.assert_array_equal(outs[1], outs[2])
  (fn,) = run.jits.values()
  return outs[2], [c for c in fn.captured.calls if isinstance(c, _KernelCall)]


def _ort(m, x): return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_tanh_gelu_with_pow_3_before_a_matmul_is_one_elementwise_kernel():
  """GPT-2's exported GELU, 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*Pow(x,3)))), then its MLP's down projection. The
  general pow's exp2 and log2, broadcast into the MatMul, each got a kernel of their own (the scheduler stores a
  broadcast transcendental): four kernels over the (64, 512) activations. x*x*x leaves tanh's exp2 alone: two; and
  since the GELU's value is stored for the MatMul anyway (the scheduler's window rule), tanh's exp2 is computed in
  that value's kernel: one."""
  n = helper.make_node
  nodes = [n("Mul", ["x", "half"], ["a"]), n("Pow", ["x", "three"], ["p"]), n("Mul", ["p", "c"], ["pc"]),
           n("Add", ["x", "pc"], ["s"]), n("Mul", ["s", "k"], ["sk"]), n("Tanh", ["sk"], ["t"]),
           n("Add", ["t", "one"], ["t1"]), n("Mul", ["a", "t1"], ["g"]), n("MatMul", ["g", "w"], ["y"])]
  rng = np.random.default_rng(0)
  consts = {"half": np.float32(0.5), "three": np.float32(3.0), "c": np.float32(0.044715),
            "k": np.float32(np.sqrt(2 / np.pi)), "one": np.float32(1.0),
            "w": (rng.standard_normal((512, 128)) / 16).astype(np.float32)}
  m = _model(nodes, (64, 512), (64, 128), consts)
  x = (rng.standard_normal((64, 512)) * 4).astype(np.float32)
  got, kernels = _run_jit(m, x)
  np.testing.assert_allclose(got, _ort(m, x), rtol=1e-4, atol=1e-4)
  elementwise = [k.name for k in kernels if k.ops < 64 * 512 * 128]
  assert len(elementwise) == 1, [k.name for k in kernels]


@pytest.mark.parametrize("exp", [3.0, 2.0, -2.0, -1.0, 0.0, 1.0, 8.0, 2.5, -0.5, np.int64(3)])
def test_pow_by_a_constant_matches_onnxruntime(exp):
  """Small integral exponents take the multiply path, others the general pow; both equal onnxruntime's, negative
  bases, zeros (pow(0, -2) = inf) and infinities included."""
  x = np.array([[-3.0, -1.5, -0.0, 0.0, 0.5, 1.0, 2.0, 7.0, np.inf, -np.inf]], np.float32)
  m = _model([helper.make_node("Pow", ["x", "e"], ["y"])], x.shape, x.shape,
             {"e": np.asarray(exp, np.int64 if isinstance(exp, np.integer) else np.float32)})
  want = _ort(m, x)
  got = OnnxRunner(m)({"x": x})["y"].numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  np.testing.assert_array_equal(np.signbit(got[np.isfinite(want) & (want == 0)]),
                                np.signbit(want[np.isfinite(want) & (want == 0)]))


def test_layernorm_before_a_matmul_is_stored_not_recomputed_per_column_tile():
  """LayerNormalization -> MatMul -> Add (a pre-norm transformer's QKV projection, tiny GPT-2's sizes): the matmul's
  kernel reads the stored normalized rows and the weight, not x, the mean, the variance, the scale and the bias of
  the normalization (which it recomputed, square root included, once per column tile: 260 us against 45 us)."""
  rng = np.random.default_rng(1)
  n = helper.make_node
  inits = {"g": rng.standard_normal(128).astype(np.float32), "b": rng.standard_normal(128).astype(np.float32),
           "w": rng.standard_normal((128, 384)).astype(np.float32), "c": rng.standard_normal(384).astype(np.float32)}
  m = _model([n("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
              n("MatMul", ["ln", "w"], ["mm"]), n("Add", ["mm", "c"], ["y"])], (64, 128), (64, 384), inits)
  x = rng.standard_normal((64, 128)).astype(np.float32)
  got, kernels = _run_jit(m, x)
  np.testing.assert_allclose(got, _ort(m, x), rtol=1e-4, atol=1e-4)
  mm = max(kernels, key=lambda k: k.ops)
  # out, the normalized rows, the weight, and the bias of the Add fused after the product
  assert len(mm.refs) == 4, (mm.name, len(mm.refs))


def test_attention_softmax_divides_once_per_row_not_inside_pv(monkeypatch):
  """Softmax -> MatMul (attention's P@V, tiny BERT's sizes): the probabilities stay inline in P@V's kernel, where
  each is read once per column tile of the output. x / rowsum put a division inside that kernel's reduce loop
  (72 us a layer); exp * (1 / rowsum) leaves a per-row reciprocal outside it. Checked on the compiled kernels'
  uops: no division or reciprocal depends on a reduce loop's index. Output against onnxruntime."""
  import tiny_codegen
  from tiny_uop.uop import AxisType, Ops
  specs = []
  real = tiny_codegen.get_program

  def recording(*a, **k):
    specs.append(spec := real(*a, **k))
    return spec
  monkeypatch.setattr(tiny_codegen, "get_program", recording)
  rng = np.random.default_rng(2)
  n = helper.make_node
  v = rng.standard_normal((1, 2, 64, 64)).astype(np.float32)
  m = _model([n("Softmax", ["x"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["y"])], (1, 2, 64, 64), (1, 2, 64, 64),
             {"v": v})
  x = (rng.standard_normal((1, 2, 64, 64)) * 3).astype(np.float32)
  got, _ = _run_jit(m, x)
  np.testing.assert_allclose(got, _ort(m, x), rtol=1e-4, atol=1e-5)
  in_loop = []
  for spec in specs:
    for u in spec.uops or []:
      if u.op in (Ops.FDIV, Ops.RECIPROCAL) and any(r.arg[1] is AxisType.REDUCE for r in u.ranges):
        in_loop.append(spec.name)
  assert specs and not in_loop, in_loop


@pytest.mark.parametrize("exp", [3.0, -2.0, 5.0])
def test_half_pow_by_a_small_integer_rounds_once(exp):
  """A float16 base to a small integral power: the products are taken in float32 and rounded to float16 once, as
  pow computes them (numpy's float32 power rounded to float16 is the reference), not rounded after every multiply."""
  x = np.array([[0.0071, -0.013, 1.37, -2.71, 11.3, 0.5, -0.0, 3.14159]], np.float16)
  g = helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"])], "g",
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(x.shape))],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, list(x.shape))],
                        [numpy_helper.from_array(np.asarray(exp, np.float16), "e")])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
  want = np.power(x.astype(np.float32), np.float32(exp)).astype(np.float16)
  np.testing.assert_array_equal(OnnxRunner(m)({"x": x})["y"].numpy(), want)
