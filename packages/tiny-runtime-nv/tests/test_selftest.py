"""`python -m tiny_runtime_nv.selftest` from a bare source tree (PYTHONPATH, no installed entry points): without an
NVIDIA GPU it fails at once with exit status 2 and says why; `--mock` runs its kernel checks on MOCK+CUDA and MOCK+NV
without importing llvmlite or tiny-tensor (the NV/CUDA path needs numpy and cffi only), then tiny-tensor's
conformance suite and speed rows on each in a child process."""
import os
import pathlib
import subprocess
import sys

import pytest
from tiny_uop.plugins.testing import hardware_present

ROOT = pathlib.Path(__file__).resolve().parents[3]
PATHS = ["tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-runtime-nv", "tiny-tensor"]


def _run(*args: str, code: str = "") -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / "packages" / p) for p in PATHS)}
  prog = code or "import runpy, sys; runpy.run_module('tiny_runtime_nv.selftest', run_name='__main__')"
  return subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, env=env, timeout=300,
                        cwd=str(ROOT.parent))


def test_without_gpu_fails_fast_with_the_reason():
  if hardware_present("libcuda") or hardware_present("/dev/nvidiactl"): pytest.skip("NVIDIA driver present")
  p = _run()
  assert p.returncode == 2, p.stdout + p.stderr
  assert "libcuda.so.1 not found" in p.stderr and "/dev/nvidiactl missing" in p.stderr


def test_mock_run_passes_without_llvmlite():
  code = ("import runpy, sys\nsys.argv[1:] = ['--mock']\n"
          "try: runpy.run_module('tiny_runtime_nv.selftest', run_name='__main__')\n"
          "except SystemExit as e: print('exit', e.code, 'llvmlite' in sys.modules, 'tiny_tensor' in sys.modules)")
  p = _run(code=code)
  assert "exit 0 False False" in p.stdout, p.stdout + p.stderr
  for row in ("elementwise a*b+exp2(a)", "row sums", "matmul fp16 (float acc)", "half-precision matmul", "conv2d 3x3",
              "softmax", "capture and replay", "device graph replay", "GEMM 64^3 float16", "GEMM 64^3 bfloat16"):
    assert row in p.stdout, row
  assert p.stdout.count("0 failed, 0 n/a") == 2, p.stdout  # the conformance table of each device
  assert "FAIL" not in p.stdout
  assert "MOCK+CUDA: " in p.stdout and "MOCK+NV: " in p.stdout and "classes 0xcbc0/0xc8b5" in p.stdout
  assert p.stdout.count("TinyJit replay host us") == 2  # both devices' timings
