"""The one-token matvec over quantized GGML weights (`tiny_tensor.llm.model.QLinear`): results against the `gguf`
package's dequantization (numpy), and the compiled kernel reading the packed bytes with vector loads."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tiny_tensor import Tensor, engine
from tiny_tensor.llm.gguf import BLOCK, GGMLType, quantize
from tiny_tensor.llm import model as model_mod
from tiny_tensor.llm.model import QLinear
from tiny_uop import Ops

gguf = pytest.importorskip("gguf")


def _qlinear(t: GGMLType, o: int, k: int, seed: int) -> tuple[QLinear, np.ndarray, np.ndarray]:
  """A QLinear of a random (o, k) weight in format t on the CPU, its raw bytes, and a random (1, k) input."""
  rng = np.random.default_rng(seed)
  raw = np.frombuffer(quantize(rng.standard_normal((o, k)).astype(np.float32), t), np.uint8).copy()
  x = rng.standard_normal((1, k)).astype(np.float32)
  return QLinear(Tensor(raw.reshape(-1, BLOCK[t][1]), device="CPU"), t, (o, k)), raw, x


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K])
def test_matvec_matches_gguf_dequantize(t: GGMLType, monkeypatch: pytest.MonkeyPatch) -> None:
  """The float32 path (a CPU without VNNI, or not Q8_0): x times the gguf package's dequantized weight."""
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)
  ql, raw, x = _qlinear(t, 96, 512, 1)
  w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(96, 512).astype(np.float64)
  got = ql(Tensor(x, device="CPU")).numpy()
  np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-3)


def _q8_act(x: np.ndarray, block: int = 32) -> np.ndarray:
  """x (k,) quantized as llama.cpp's quantize_row_q8_0 (block 32) or its Q8_K (256) does, back to float64: per
  block, d = max|x| / 127 and round(x / d) * d (numpy rounds ties to even, llama.cpp's roundf away from zero: random
  data has no ties)."""
  xb = x.astype(np.float64).reshape(-1, block)
  d = (np.abs(xb).max(-1, keepdims=True) / 127).astype(np.float32).astype(np.float64)
  q = np.clip(np.round(np.divide(xb, d, out=np.zeros_like(xb), where=d > 0)), -127, 127)
  return (q * d).reshape(-1)


@pytest.mark.parametrize("t, o, k", [(GGMLType.Q8_0, 96, 512), (GGMLType.Q8_0, 40, 96), (GGMLType.Q8_0, 2048, 768),
                                     (GGMLType.Q4_K, 96, 512), (GGMLType.Q4_K, 12, 256), (GGMLType.Q4_K, 768, 2048)])
def test_int8_activations_match_gguf_dequantize(t: GGMLType, o: int, k: int) -> None:
  """Q8_0 and Q4_K on a VNNI CPU: the activations quantized to int8 (llama.cpp's: Q8_0 per 32-block, Q4_K per
  256-value super-block, its Q8_K), times the weight's int8 values or nibbles (`x86_vnni`): against the gguf
  package's dequantized weight times numpy's int8 activations (tight), and within the int8 error of the float32
  product (rms error of the rms output on this normal data: 0.52-0.56% per 32, 0.52-0.80% per 256; the bound 1%)."""
  from tiny_tensor.llm.quants import int8_dot_products
  if not int8_dot_products("CPU"): pytest.skip("no VNNI on this CPU: decode keeps float32 activations")
  ql, raw, x = _qlinear(t, o, k, 4)
  w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(o, k).astype(np.float64)
  got = ql(Tensor(x, device="CPU")).numpy().reshape(-1)
  want = w @ _q8_act(x.reshape(-1), 256 if t == GGMLType.Q4_K else 32)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
  f32 = w @ x.reshape(-1).astype(np.float64)
  rel = float(np.sqrt(np.mean((got - f32) ** 2) / np.mean(f32 ** 2)))
  assert 1e-5 < rel < 0.01, rel  # not 0: the int8 path ran


def test_q4k_matvec_loads_the_nibble_bytes_as_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)  # the float32 path's kernel
  # the nibble bytes of a Q4_K sub-block sit at base + 0..15 with an i32 index sign-extended for the address: only
  # with `nsw` on the index adds can LLVM prove them contiguous and merge the 16 unrolled byte loads into one vector
  # load (before: 16 scalar byte loads per step, the kernel 1.7x slower)
  from tiny_codegen import get_program
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  ql, raw, x = _qlinear(GGMLType.Q4_K, 2048, 768, 2)
  xt = Tensor(x, device="CPU")
  ast = next(c.src[0] for c in engine.plan([ql(xt).uop]).calls if c.src[0].op is Ops.SINK)
  ren = LLVMRenderer()
  ir = ren.make_compiler().optimized_ir(get_program(ast, ren).src)
  assert re.search(r"load <\d+ x i8>", ir), "the Q4_K nibble bytes are loaded one at a time"
  w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(2048, 768).astype(np.float64)
  np.testing.assert_allclose(ql(xt).numpy(), x.astype(np.float64) @ w.T, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("o, k", [(24, 64), (7, 48), (13, 80), (5, 40)])
def test_float_linear_one_token_matches_numpy(o: int, k: int) -> None:
  """A float32 `Linear`'s one-token product: `quants.f32_matvec`'s prefetching kernel where the CPU's vectors divide
  K (the LLVM renderer), `x @ W.T` lowered as usual elsewhere (K = 40 on 16-float vectors); both against numpy."""
  from tiny_tensor.llm.model import Linear
  from tiny_tensor.llm.quants import f32_matvec
  rng = np.random.default_rng(o * 100 + k)
  w, x = rng.standard_normal((o, k), dtype=np.float32), rng.standard_normal((1, k), dtype=np.float32)
  lin = Linear(Tensor(w, device="CPU"))
  got = lin(Tensor(x, device="CPU")).numpy()
  assert got.shape == (1, o)
  np.testing.assert_allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match=r"not a float32 \(O, K\) weight"): f32_matvec(Tensor(w), Tensor(x))
