"""The mock GPU's background ptxas checker: a ptxas that can't be started is a failure named in `check()`, never a
dead worker thread that leaves `drain()` waiting out its timeout and the modules unchecked (a CI run once waited
600 s at exit and passed with nothing assembled)."""
import os
import time

import pytest

from tiny_runtime_nv.mock.compiler import CompileError, PtxasChecker

PTX = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n"


def test_a_ptxas_that_wont_start_is_a_named_failure_not_a_hang(tmp_path):
  missing = str(tmp_path / "no-ptxas")
  c = PtxasChecker(missing)
  c.submit(PTX, "sm_80")
  st = time.perf_counter()
  c.drain(timeout=30)
  assert time.perf_counter() - st < 30
  with pytest.raises(CompileError, match="could not run .*no-ptxas"): c.check()


def test_a_drain_that_times_out_is_a_failure(tmp_path):
  slow = tmp_path / "slow-ptxas"
  slow.write_text("#!/bin/sh\nsleep 5\n")
  os.chmod(slow, 0o755)
  c = PtxasChecker(str(slow))
  c.submit(PTX, "sm_80")
  c.drain(timeout=0.1)
  with pytest.raises(CompileError, match="not assembled after 0.1 s"): c.check()
