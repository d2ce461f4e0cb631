"""The gradient fuzzer (issue #38, see grad_fuzz.py): random programs, each built in tiny and in torch from one
description, must agree on the loss and on every parameter's gradient.

GRAD_FUZZ_N programs (default 200, about 3 minutes on 2 cores) from GRAD_FUZZ_SEED (default 0), in chunks so that
a failure names its chunk; GRAD_FUZZ_N=5000 for a long local run. A failing seed prints its shrunk program as
runnable tiny code (`python -c "..."` next to grad_fuzz.py reproduces it).
"""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

import grad_fuzz as gf

N = int(os.environ.get("GRAD_FUZZ_N", "200"))
SEED0 = int(os.environ.get("GRAD_FUZZ_SEED", "0"))
CHUNK = 50


@pytest.mark.parametrize("start", range(SEED0, SEED0 + N, CHUNK))
def test_grad_fuzz(start):
  bad, skipped = gf.find_failures(range(start, min(start + CHUNK, SEED0 + N)))
  assert skipped <= CHUNK // 4, f"{skipped} of {CHUNK} programs skipped (torch not finite): the generator drifted"
  report = "\n\n".join(f"seed {seed}: {why}\n{prog.source()}" for seed, why, prog in bad)
  assert not bad, f"{len(bad)} programs disagree with torch:\n{report}"


def test_generate_is_deterministic():
  a, b = gf.generate(123), gf.generate(123)
  assert a.source() == b.source() and len(a.steps) >= 1


def test_shrink_keeps_a_failure():
  """The shrinker on a planted failure (a 'fails' predicate that flags programs with a softplus step): the result
  still fails, with fewer steps."""
  prog = next(p for p in map(gf.generate, range(500)) if any("softplus" in s.tiny for s in p.steps) and
              len(p.steps) >= 4)
  def fails(p):
    return "softplus" if any("softplus" in s.tiny for s in p.steps) else None
  small = gf.shrink(prog, fails)
  assert fails(small) is not None and len(small.steps) < len(prog.steps)


# ***** found by the fuzzer *****

def test_conv_maxpool_1x1_padded_grads_realized_together():
  """MAXPOOL_1X1_PADDED (issue #38): a conv's bias and weight gradients realized together through a padded max_pool2d
  with a 1-pixel output were NaN on the CPU's LLVM kernels (AVX-512 hosts): LLVM's x86 backend let the 0/0 of the
  pool gradient's padding lanes through their select mask. Kernel-level test: tiny-codegen's test_padded_lanes.py."""
  rng = np.random.default_rng(0)
  bn, wn = rng.standard_normal(3).astype(np.float32), rng.standard_normal((3, 3, 1, 1)).astype(np.float32)
  xn = rng.standard_normal((1, 3, 2, 2)).astype(np.float32)
  b, w = Tensor(bn, requires_grad=True), Tensor(wn, requires_grad=True)
  v = Tensor(xn).conv2d(w, b).max_pool2d(3, stride=2, padding=1)
  rn = rng.standard_normal(tuple(v.shape)).astype(np.float32)
  (v * Tensor(rn)).sum().backward()
  Tensor.realize(b.grad, w.grad)
  bt, wt = torch.tensor(bn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  (F.max_pool2d(F.conv2d(torch.tensor(xn), wt, bt), 3, stride=2, padding=1) * torch.tensor(rn)).sum().backward()
  np.testing.assert_allclose(b.grad.numpy(), bt.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-4)
