"""The root conftest.py deselects, at collection, the tests pinned to another session's device
(``@pytest.mark.dev_session("CPU")``): a device session (``DEV=MOCK+AMD``) reports them as deselected, never as
skipped, and the session they are pinned to runs them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = '''import pytest

def test_everywhere(): assert 1 + 1 == 2

@pytest.mark.dev_session("CPU")
def test_cpu_only(): assert 2 * 2 == 4

@pytest.mark.dev_session("MOCK+AMD", "MOCK+NV")
def test_two_gpus(): assert 3 - 1 == 2
'''


def _summary(tmp_path: Path, dev: str | None) -> str:
  shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
  (tmp_path / "test_pinned.py").write_text(TESTS)
  env = {k: v for k, v in os.environ.items() if k != "DEV"}
  if dev is not None: env["DEV"] = dev
  r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", str(tmp_path)],
                     capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "skipped" not in r.stdout, r.stdout
  return re.findall(r"^(\d+ passed.*?) in ", r.stdout, re.M)[-1]


@pytest.mark.parametrize("dev, want", [(None, "2 passed, 1 deselected"), ("CPU:CLANG", "2 passed, 1 deselected"),
                                       ("MOCK+AMD:LLVM:gfx942", "2 passed, 1 deselected"),
                                       ("MOCK+QCOM", "1 passed, 2 deselected")])
def test_pinned_tests_are_deselected_not_skipped(tmp_path, dev, want):
  assert _summary(tmp_path, dev) == want
