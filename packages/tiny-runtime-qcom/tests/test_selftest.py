"""`python -m tiny_runtime_qcom.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
Adreno GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks (against numpy) on
MOCK+QCOM without importing tiny-tensor. (The conformance suite step is left out here, `--no-tensor`: on PoCL it
builds ~100 kernels, a minute of CPU; tiny-tensor's own MOCK+QCOM sessions run that suite.)"""
import pathlib

import pytest
from tiny_uop.plugins.testing import SourceTreeSelftest, hardware_present

SELFTEST = SourceTreeSelftest("tiny_runtime_qcom", pathlib.Path(__file__).resolve().parents[3])


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("/dev/kgsl-3d0"): pytest.skip("KGSL driver present")
  SELFTEST.check_without_gpu("Adreno GPU", "/dev/kgsl-3d0 missing")


def test_mock_run_passes():
  p = SELFTEST.run("--mock", "--no-tensor")
  assert p.returncode == 0 and "tiny_tensor" not in p.imported, p.stdout + p.stderr
  assert "MOCK+QCOM: Adreno a630 (chip id 0x06030001)" in p.stdout
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "copy host->device->host"):
    assert f"ok   {row}" in p.stdout, row
  assert "FAIL" not in p.stdout and "tiny conformance" not in p.stdout
