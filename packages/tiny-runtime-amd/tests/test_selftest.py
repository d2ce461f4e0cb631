"""`python -m tiny_runtime_amd.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
AMD GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks (against numpy) on
MOCK+AMD (gfx1100) and, with DEV=MOCK+AMD:LLVM:gfx942, on the mocked MI300 without importing tiny-tensor, then
tiny-tensor's conformance suite in a child process."""
import pathlib

import pytest
from tiny_uop.plugins.testing import SourceTreeSelftest, hardware_present

SELFTEST = SourceTreeSelftest("tiny_runtime_amd", pathlib.Path(__file__).resolve().parents[3])


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("/dev/kfd"): pytest.skip("AMD KFD driver present")
  SELFTEST.check_without_gpu("AMD GPU", "/dev/kfd missing")


def test_mock_run_passes_with_the_conformance_suite():
  p = SELFTEST.run("--mock")
  assert p.returncode == 0 and "tiny_tensor" not in p.imported, p.stdout + p.stderr
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "copy host->device->host",
              "half-precision matmul", "conv2d 3x3", "capture and replay", "device graph replay"):
    assert row in p.stdout, row
  assert "MOCK+AMD: gfx1100, 96 CUs, 1 XCC(s), wave32" in p.stdout
  assert p.stdout.count("0 failed, 0 n/a") == 1 and "FAIL" not in p.stdout


def test_mock_run_on_the_mocked_mi300():
  p = SELFTEST.run("--mock", "--no-tensor", dev="MOCK+AMD:LLVM:gfx942")
  assert p.returncode == 0 and "tiny_tensor" not in p.imported, p.stdout + p.stderr
  assert "MOCK+AMD:LLVM:gfx942: gfx942, 38 CUs, 1 XCC(s), wave64" in p.stdout
  assert p.stdout.count("  ok   ") == 4 and "FAIL" not in p.stdout and "tiny conformance" not in p.stdout
