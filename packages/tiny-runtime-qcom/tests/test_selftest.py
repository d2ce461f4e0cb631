"""`python -m tiny_runtime_qcom.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
Adreno GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks (against numpy) on
MOCK+QCOM without importing tiny-tensor. (The conformance suite step is left out here, `--no-tensor`: on PoCL it
builds ~100 kernels, a minute of CPU; tiny-tensor's own MOCK+QCOM sessions run that suite.)"""
import os
import pathlib
import subprocess
import sys

import pytest
from tiny_uop.plugins.testing import hardware_present

ROOT = pathlib.Path(__file__).resolve().parents[3]
PATHS = ["tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-runtime-qcom", "tiny-tensor"]


def _run(code: str = "") -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / "packages" / p) for p in PATHS)}
  env.pop("DEV", None)
  prog = code or "import runpy, sys; runpy.run_module('tiny_runtime_qcom.selftest', run_name='__main__')"
  return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=600,
                        cwd=str(ROOT.parent))


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("/dev/kgsl-3d0"): pytest.skip("KGSL driver present")
  p = _run()
  assert p.returncode == 2, p.stdout + p.stderr
  assert "no Adreno GPU usable here" in p.stderr and "/dev/kgsl-3d0 missing" in p.stderr


def test_mock_run_passes():
  code = ("import runpy, sys\nsys.argv[1:] = ['--mock', '--no-tensor']\n"
          "try: runpy.run_module('tiny_runtime_qcom.selftest', run_name='__main__')\n"
          "except SystemExit as e: print('exit', e.code, 'tiny_tensor' in sys.modules)")
  p = _run(code)
  assert "exit 0 False" in p.stdout, p.stdout + p.stderr
  assert "MOCK+QCOM: Adreno a630 (chip id 0x06030001)" in p.stdout
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "copy host->device->host"):
    assert f"ok   {row}" in p.stdout, row
  assert "FAIL" not in p.stdout and "tiny conformance" not in p.stdout
