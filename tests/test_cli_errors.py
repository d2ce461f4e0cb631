"""A user's mistake or a missing piece of the machine, met by one of tiny's programs (the demo here; every
``python -m tiny_...`` entry point goes through the same `tiny_uop.plugins.cli.run_main`): one line on stderr that
says what happened and how to fix it, a non-zero exit status, and the traceback only under ``DEBUG=1``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "examples" / "demo.py")
# a machine without any C compiler: no clang/cc/gcc on PATH and no ziglang fallback (the cc tool without bundles)
NO_CC = ("import runpy, sys\nfrom tiny_uop.tools import Tool, register_tool\n"
         "register_tool(Tool('cc', 'CC', ('clang', 'cc', 'gcc')))\n"
         "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def _run(argv: list[str], env: dict[str, str], path: str | None = None) -> subprocess.CompletedProcess:
  full = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DEBUG": "0", **env}
  full.pop("CC", None)
  if path is not None: full["PATH"] = path
  return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=full, timeout=300,
                        stdin=subprocess.DEVNULL)


def _one_line_error(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
  assert "Traceback" not in r.stderr, r.stderr
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and lines[0].startswith("demo: error: "), r.stderr
  return lines[0]


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has an AMD GPU driver: DEV=AMD opens")
def test_dev_amd_without_a_gpu_is_one_line_with_the_fix():
  line = _one_line_error(_run([DEMO, "--steps", "1", "--quiet"], {"DEV": "AMD"}))
  assert "device 'AMD' is unavailable: no /dev/kfd" in line and "DEV=MOCK+AMD" in line and "DEBUG=1" in line
  r = _run([DEMO, "--steps", "1", "--quiet"], {"DEV": "AMD", "DEBUG": "1"})
  assert r.returncode != 0 and "Traceback" in r.stderr and "DeviceUnavailableError" in r.stderr


def test_unknown_device_is_one_line_with_a_suggestion():
  line = _one_line_error(_run([DEMO, "--steps", "1", "--quiet"], {"DEV": "AMDD"}))
  assert "unknown device 'AMDD'" in line and "did you mean 'AMD'?" in line


def test_cpu_clang_without_a_compiler_is_one_line_with_the_fix(tmp_path):
  bindir = tmp_path / "bin"  # PATH: nothing but env (no clang, cc, gcc, ld)
  bindir.mkdir()
  os.symlink("/usr/bin/env", bindir / "env")
  r = _run(["-c", NO_CC, DEMO, "--steps", "1", "--quiet"], {"DEV": "CPU:CLANG"}, path=str(bindir))
  line = _one_line_error(r)
  assert "DEV=CPU:CLANG needs a C compiler" in line and "pip install ziglang" in line and "CPU:LLVM" in line
