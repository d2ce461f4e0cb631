"""`python -m tiny_runtime_nv.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
NVIDIA GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks on MOCK+CUDA and MOCK+NV
without importing llvmlite or tiny-tensor (the NV/CUDA path needs numpy and cffi only), then tiny-tensor's
conformance suite and speed rows on each in a child process."""
import pathlib

import pytest
from tiny_uop.plugins.testing import SourceTreeSelftest, hardware_present

SELFTEST = SourceTreeSelftest("tiny_runtime_nv", pathlib.Path(__file__).resolve().parents[3])


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("libcuda") or hardware_present("/dev/nvidiactl"): pytest.skip("NVIDIA driver present")
  SELFTEST.check_without_gpu("NVIDIA GPU", "libcuda.so.1 not found", "/dev/nvidiactl missing")


def test_mock_run_passes_without_llvmlite():
  p = SELFTEST.run("--mock", timeout=300)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "llvmlite" not in p.imported and "tiny_tensor" not in p.imported, sorted(p.imported)
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "half-precision matmul", "conv2d 3x3",
              "softmax", "capture and replay", "device graph replay", "GEMM 64^3 float16", "GEMM 64^3 bfloat16"):
    assert row in p.stdout, row
  assert p.stdout.count("0 failed, 0 n/a") == 2, p.stdout  # the conformance table of each device
  assert "FAIL" not in p.stdout
  assert "MOCK+CUDA: " in p.stdout and "MOCK+NV: " in p.stdout and "classes 0xcbc0/0xc8b5" in p.stdout
  assert p.stdout.count("TinyJit replay host us") == 2  # both devices' timings
