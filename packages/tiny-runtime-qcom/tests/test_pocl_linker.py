"""PoCL from PyPI on a machine without binutils' ``ld`` or gcc's libgcc (tiny_runtime_qcom.opencl.pocl_linker): the
CL device links its kernels with ld.lld from PyPI (ziglang) and computes what numpy does; without any linker, opening
CL is a clear error, never PoCL aborting the process (it used to end with SIGABRT, exit 134)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tiny_runtime_qcom.opencl import pypi_pocl
from tiny_uop.tools import find_tool

pytestmark = pytest.mark.skipif(pypi_pocl() is None, reason="PoCL from PyPI not installed (pip install "
                                                            "pocl-binary-distribution)")
PROGRAM = ("import os\nfrom tiny_tensor import Tensor\n"
           "print((Tensor([1.5, -2.0, 3.25, 7.0], device='CL') * 3 - 1).tolist())\n"
           "print(os.environ.get('COMPILER_PATH', ''))\n")
NO_LLD = "from tiny_uop.tools import Tool, register_tool\nregister_tool(Tool('ld.lld', 'LD_LLD', ('ld.lld',)))\n"


def _run(tmp_path, code: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
  bindir = tmp_path / "bin"  # a PATH without ld, gcc, cc or clang
  bindir.mkdir(exist_ok=True)
  env = {**os.environ, "PATH": str(bindir), "POCL_CACHE_DIR": str(tmp_path / "pocl"),
         "TINY_CACHE_DIR": str(tmp_path / "tiny"), "PYTHONDONTWRITEBYTECODE": "1", "DEBUG": "0"}
  for k in ("COMPILER_PATH", "DEV", "LD_LLD", "TINY_OPENCL_ICD"): env.pop(k, None)
  return subprocess.run([*(prefix or []), sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=300, stdin=subprocess.DEVNULL)


def _check(r: subprocess.CompletedProcess) -> None:
  assert r.returncode == 0, r.stderr[-3000:]
  got, compiler_path = r.stdout.splitlines()[-2:]
  want = (np.array([1.5, -2.0, 3.25, 7.0], np.float32) * 3 - 1).tolist()
  assert eval(got) == want  # noqa: S307 - our own subprocess's printed list
  assert "pocl-ld-" in compiler_path  # the ld.lld wrapper did the link


@pytest.mark.skipif(find_tool("ld.lld") is None, reason="ld.lld not installed (pip install ziglang)")
def test_cl_links_with_ld_lld_from_pypi_without_ld_on_path(tmp_path):
  _check(_run(tmp_path, PROGRAM))
  # where this process may make a mount namespace (root, unshare): also hide binutils' ld and gcc's libgcc on disk
  unshare = shutil.which("unshare")
  probe = subprocess.run([unshare, "-m", "true"], capture_output=True) if unshare else None
  if unshare and probe is not None and probe.returncode == 0:
    hide = ("mount -t tmpfs none /usr/lib/gcc 2>/dev/null; for f in /usr/bin/ld /usr/bin/ld.bfd /usr/bin/ld.gold; "
            "do [ -e $f ] && mount --bind /dev/null $f; done; exec \"$@\"")
    _check(_run(tmp_path, PROGRAM, [unshare, "-m", "/bin/sh", "-c", hide, "sh"]))


def test_cl_without_any_linker_is_a_clear_error(tmp_path):
  r = _run(tmp_path, NO_LLD + PROGRAM)
  assert r.returncode == 1 and r.returncode != 134, r.stderr[-3000:]
  last = r.stderr.strip().splitlines()[-1]
  assert "links every kernel with the system linker `ld`" in last and "pip install ziglang" in last, last
