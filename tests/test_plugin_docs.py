"""docs/PLUGINS.md's native-code section and the plugin template's rename.py, cheaply: the section's loader runs a
kernel that tiny-codegen's C renderer and a C compiler made, against numpy; rename.py leaves no 'template' in any
file name and writes "an ACME device"."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiny_uop.tools import find_tool

ROOT = Path(__file__).resolve().parents[1]


def _native_section() -> str:
  text = (ROOT / "docs/PLUGINS.md").read_text()
  section = text[text.index("## Native-code backends"):]
  m = re.search(r"```python\n(.*?)```", section, re.S)
  assert m is not None
  return m.group(1)


@pytest.mark.skipif(find_tool("cc") is None, reason="no C compiler (pip install ziglang)")
def test_native_section_loads_and_runs_a_c_kernel():
  from tiny_codegen import get_program
  from tiny_codegen.renderer.cstyle import ClangRenderer
  from tiny_uop import KernelInfo, Ops, UOp, dtypes
  ns: dict = {}
  exec(compile(_native_section(), "docs/PLUGINS.md", "exec"), ns)  # noqa: S102 - the documented code itself
  N = 1000
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(N), arg=k) for k in range(3))
  i = UOp.range(N, 0)
  ast = c.index(i).store(a.index(i).load() * b.index(i).load() + 1.0).sink(arg=KernelInfo())
  ren = ClangRenderer()
  ren.threads, ren.thread_min_work = 4, 0  # several core_ids: the launch loop splits the range
  spec = get_program(ast, ren)
  assert spec.global_size[0] > 1, spec.global_size
  dll, fn = ns["load_kernel"](spec.lib, spec.name)
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  out = np.zeros(N, np.float32)
  ns["launch"](fn, [out.ctypes.data, x.ctypes.data, y.ctypes.data], (), tuple(spec.global_size))
  np.testing.assert_array_equal(out, x * y + np.float32(1))
  with pytest.raises(AttributeError, match="not_a_kernel"): ns["load_kernel"](spec.lib, "not_a_kernel")
  del dll


def test_rename_renames_file_names_and_articles(tmp_path):
  src = tmp_path / "acme-plugin"
  shutil.copytree(ROOT / "examples" / "plugin-template", src,
                  ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
  r = subprocess.run([sys.executable, "rename.py", "acme"], cwd=src, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  names = [p.relative_to(src).as_posix() for p in src.rglob("*")]
  assert "tests/test_acme_device.py" in names and not [n for n in names if "template" in n.lower()], names
  texts = {p.name: p.read_text() for p in src.rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".md")}
  assert not [(n, m.group(0)) for n, t in texts.items() for m in re.finditer(r"\b[Aa] ACME\b", t)]
  assert "an ACME device" in texts["pyproject.toml"]
  # a consonant-initial name keeps "a"
  src2 = tmp_path / "zeta-plugin"
  shutil.copytree(ROOT / "examples" / "plugin-template", src2, ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run([sys.executable, "rename.py", "zeta"], cwd=src2, check=True, capture_output=True, timeout=60)
  assert "a ZETA device" in (src2 / "pyproject.toml").read_text()
