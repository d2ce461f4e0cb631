"""`Tensor.dot` on an AVX2 CPU realizes a large right operand as contiguous column panels first (`gemm_panel`): the
results, gradients and kernels of those matmuls, with the CPU renderer's register file set to AVX2's or AVX-512's
whatever this host has."""
import os

import numpy as np
import pytest
import torch
from tiny_tensor import Tensor
from tiny_uop import Ops, dtypes
from tiny_uop.plugins import Device

pytestmark = pytest.mark.skipif(os.environ.get("DEV", "CPU") not in ("", "CPU"),
                                reason="CPU-pinned: the packing is the CPU renderer's; other sessions read B in place")


@pytest.fixture
def registers(monkeypatch):
  """Set the CPU renderer's vector register file (count, bytes) that `gemm_panel` reads."""
  ren = Device["CPU"].renderer
  if not hasattr(ren, "vector_registers"): pytest.fail(f"{type(ren).__name__} has no vector_registers")

  def use(regs: int, width: int) -> None:
    monkeypatch.setattr(type(ren), "vector_registers", property(lambda self: (regs, width)))
  return use


def kernels(t: Tensor) -> list[str]:
  return [c.src[0].arg.name for c in t.schedule().calls if c.src[0].op is Ops.SINK]


rng = np.random.default_rng(23)


@pytest.mark.parametrize("regs, packed", [((16, 32), True), ((32, 64), False)])
def test_matmul_packs_b_on_avx2_only(registers, regs: tuple, packed: bool) -> None:
  registers(*regs)
  a, b = rng.standard_normal((128, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
  out = Tensor(a) @ Tensor(b)
  names = kernels(out)
  # packed: one copy of B into 32 panels of 16 columns (32 x 512 x 16), then the matmul reading them
  assert names == (["E_32_512_16", "r_128_512"] if packed else ["r_128_512"]), names
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_small_and_narrow_matmuls_read_b_in_place(registers) -> None:
  registers(16, 32)
  for m, k, n in ((63, 512, 512), (64, 256, 256), (64, 1024, 1000)):  # few rows; B within L2; no whole panels
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = Tensor(a) @ Tensor(b)
    assert len(kernels(out)) == 1, (m, k, n)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_packed_matmul_batched_transposed_and_fused(registers) -> None:
  # a batched left operand (its rows: 2 x 40), B a transposed view (nn.Linear's weight.T), relu fused after
  registers(16, 32)
  x, w = rng.standard_normal((2, 40, 256)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
  out = (Tensor(x) @ Tensor(w).T).relu()
  assert len(kernels(out)) == 2
  np.testing.assert_allclose(out.numpy(), np.maximum(x @ w.T, 0), rtol=1e-4, atol=1e-4)


def test_packed_half_matmul_sums_in_float(registers) -> None:
  registers(16, 32)
  a, b = rng.standard_normal((128, 512)).astype(np.float16), rng.standard_normal((512, 512)).astype(np.float16)
  out = Tensor(a) @ Tensor(b)
  assert out.dtype == dtypes.half and len(kernels(out)) == 2
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
  np.testing.assert_allclose(out.numpy().astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-2)


def test_packed_matmul_gradients_match_torch(registers) -> None:
  registers(16, 32)
  a, b = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
  g = rng.standard_normal((64, 512)).astype(np.float32)
  ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
  ((ta @ tb) * Tensor(g)).sum().backward()
  pa, pb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ((pa @ pb) * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(ta.grad.numpy(), pa.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(tb.grad.numpy(), pb.grad.numpy(), rtol=1e-4, atol=1e-3)
