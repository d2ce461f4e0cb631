"""`python -m tiny_runtime_amd.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
AMD GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks (against numpy) on
MOCK+AMD (gfx1100) and, with DEV=MOCK+AMD:LLVM:gfx942, on the mocked MI300 without importing tiny-tensor, then
tiny-tensor's conformance suite in a child process."""
import os
import pathlib
import subprocess
import sys

import pytest
from tiny_uop.plugins.testing import hardware_present

ROOT = pathlib.Path(__file__).resolve().parents[3]
PATHS = ["tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-runtime-amd", "tiny-tensor"]


def _run(*args: str, code: str = "", dev: str = "") -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / "packages" / p) for p in PATHS)}
  env.pop("DEV", None)
  if dev: env["DEV"] = dev
  prog = code or "import runpy, sys; runpy.run_module('tiny_runtime_amd.selftest', run_name='__main__')"
  return subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, env=env, timeout=600,
                        cwd=str(ROOT.parent))


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("/dev/kfd"): pytest.skip("AMD KFD driver present")
  p = _run()
  assert p.returncode == 2, p.stdout + p.stderr
  assert "no AMD GPU usable here" in p.stderr and "/dev/kfd missing" in p.stderr


def _mock_code(*extra: str) -> str:
  return ("import runpy, sys\nsys.argv[1:] = ['--mock', " + ", ".join(repr(e) for e in extra) + "]\n"
          "try: runpy.run_module('tiny_runtime_amd.selftest', run_name='__main__')\n"
          "except SystemExit as e: print('exit', e.code, 'tiny_tensor' in sys.modules)")


def test_mock_run_passes_with_the_conformance_suite():
  p = _run(code=_mock_code())
  assert "exit 0 False" in p.stdout, p.stdout + p.stderr
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "copy host->device->host",
              "half-precision matmul", "conv2d 3x3", "capture and replay", "device graph replay"):
    assert row in p.stdout, row
  assert "MOCK+AMD: gfx1100, 96 CUs, 1 XCC(s), wave32" in p.stdout
  assert p.stdout.count("0 failed, 0 n/a") == 1 and "FAIL" not in p.stdout


def test_mock_run_on_the_mocked_mi300():
  p = _run(code=_mock_code("--no-tensor"), dev="MOCK+AMD:LLVM:gfx942")
  assert "exit 0 False" in p.stdout, p.stdout + p.stderr
  assert "MOCK+AMD:LLVM:gfx942: gfx942, 38 CUs, 1 XCC(s), wave64" in p.stdout
  assert p.stdout.count("  ok   ") == 4 and "FAIL" not in p.stdout and "tiny conformance" not in p.stdout
