"""fp32 matrix-vector products (a batch of 1-3 rows) in both weight layouts, through TinyJit, against numpy: `x @ W`
(W K x N row-major: the CPU heuristic's `_matvec_block` puts N in vectors of accumulators) and `x @ W.T` (nn.Linear's
and ONNX Gemm transB's layout: the reduce contiguous), with K and N that are not multiples of any vector."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_tensor import Tensor, TinyJit


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("K, N", [(768, 256), (37, 96), (64, 45), (129, 131)])
def test_matvec_matches_numpy(M: int, K: int, N: int, transposed: bool) -> None:
  """Each replay of the jitted product equals numpy's (float64 reference) on fresh inputs."""
  rng = np.random.default_rng(M * 1000 + K + N)
  w = rng.standard_normal((N, K) if transposed else (K, N), dtype=np.float32)
  tw = Tensor(w).realize()
  jitted = TinyJit(lambda x, y: (x @ (y.T if transposed else y)).realize())
  for _ in range(3):
    x = rng.standard_normal((M, K), dtype=np.float32)
    got = jitted(Tensor(x).realize(), tw).numpy()
    want = x.astype(np.float64) @ (w.T if transposed else w).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
