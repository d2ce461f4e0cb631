"""The README's compiler-only example as a newcomer runs it: a venv with nothing but tiny-uop, tiny-codegen and
llvmlite (no numpy, no ziglang, no NVIDIA wheel), a PATH without any compiler, and no ptxas anywhere. Every
renderer's source is printed, LLVM IR and AMDGPU compile in-process, and C and PTX say which tool they need."""
from __future__ import annotations

import os
import re
import subprocess
import venv
from pathlib import Path

import llvmlite

PKGS = Path(__file__).resolve().parents[2]
README = PKGS / "tiny-codegen" / "README.md"
# a machine without CUDA: ptxas is also looked for at a fixed path, /usr/local/cuda/bin/ptxas, which PATH can't hide
NO_TOOLS = ("import dataclasses\nfrom tiny_uop.tools import TOOLS, register_tool\n"
            "register_tool(dataclasses.replace(TOOLS['ptxas'], path_names=('ptxas',)))\n")


def _example() -> str:
  text = README.read_text()
  section = text[text.index("## Example: a kernel from UOps"):]
  m = re.search(r"```python\n(.*?)```", section, re.S)
  assert m is not None, "the README's example has no python block"
  return m.group(1)


def test_readme_example_without_any_tool(tmp_path):
  env_dir = tmp_path / "venv"
  venv.create(env_dir, with_pip=False)
  (tmp_path / "deps").mkdir()
  os.symlink(os.path.dirname(llvmlite.__file__), tmp_path / "deps" / "llvmlite")
  site = next(env_dir.glob("lib/python3*/site-packages"))
  (site / "tiny.pth").write_text(f"{PKGS / 'tiny-uop'}\n{PKGS / 'tiny-codegen'}\n{tmp_path / 'deps'}\n")
  bindir = tmp_path / "bin"  # PATH: no clang, cc, gcc, ld, ptxas
  bindir.mkdir()
  env = {"PATH": str(bindir), "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1", "CACHELEVEL": "0"}
  py = str(env_dir / "bin" / "python")
  r = subprocess.run([py, "-c", "import numpy"], capture_output=True, text=True, env=env, timeout=60)
  assert r.returncode != 0 and "No module named 'numpy'" in r.stderr  # really without numpy
  r = subprocess.run([py, "-c", NO_TOOLS + _example()], capture_output=True, text=True, env=env, timeout=300,
                     stdin=subprocess.DEVNULL, cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  out = r.stdout
  parts = dict(re.findall(r"=== (\w+)\n(.*?)(?==== |\Z)", out, re.S))
  assert set(parts) == {"ClangRenderer", "LLVMRenderer", "PTXRenderer", "AMDGPURenderer"}, out
  c, ll, ptx, amd = parts["ClangRenderer"], parts["LLVMRenderer"], parts["PTXRenderer"], parts["AMDGPURenderer"]
  assert "float* restrict data0" in c and "data1" in c and "cc: not found" in c and "pip install ziglang" in c
  assert "not compiled: no C compiler found" in c
  assert "define void @" in ll and re.search(r"E_16 \(1, 1, 1\) \d+ bytes", ll)
  assert ".target sm_90" in ptx and "ptxas: not found" in ptx and "pip install nvidia-cuda-nvcc" in ptx
  assert "amdgcn-amd-amdhsa" in amd and re.search(r"E_16 \(1, 1, 1\) \d+ bytes", amd)
