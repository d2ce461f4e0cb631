"""`python -m tiny_tensor.tune`: the BEAM winners it stores are the ones a later `BEAM=n` run of the same op looks up
(the search itself is stubbed here: timing candidates is BEAM's own tests' business, and slow)."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_tensor import Tensor, tune
from tiny_uop import device as uop_device
from tiny_uop.helpers import Context

pytestmark = pytest.mark.dev_session("CPU")  # the per-machine cache of the CPU renderer


def test_tune_warms_the_cache_a_beam_run_reads(monkeypatch, tmp_path, capsys) -> None:
  from tiny_codegen.opt import search
  from tiny_codegen.opt.kernel import Opt, OptOps
  monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(uop_device, "_db_conn", None)  # a fresh cache database under tmp_path
  winner = (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4))
  searched: list[str] = []

  def fake_search(ast, renderer, amt, compile=None):  # noqa: ARG001
    searched.append(ast.arg.name)
    return [], winner
  monkeypatch.setattr(search, "beam_candidates", fake_search)
  assert tune.main(["--list", "--sizes", "64", "--no-conv", "--beam", "1"]) == 0
  assert "not tuned" in capsys.readouterr().out and not searched
  assert tune.main(["--sizes", "64", "--no-conv", "--beam", "1"]) == 0
  assert len(searched) == 1, searched
  assert tune.main(["--list", "--sizes", "64", "--no-conv", "--beam", "1"]) == 0
  assert str(winner) in capsys.readouterr().out.splitlines()[-1]

  def no_search(ast, renderer, amt):  # noqa: ARG001
    pytest.fail(f"BEAM searched {ast.arg.name} again: the tuned winner wasn't found")
  monkeypatch.setattr(search, "beam_candidates", no_search)
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
  with Context(BEAM=1, CACHELEVEL=2):
    got = (Tensor(a) @ Tensor(b)).numpy()
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


def test_tune_refuses_bad_arguments(capsys) -> None:
  for args, what in ((["--beam", "0"], "--beam must be 1 or more, got 0"), (["--sizes", "0"], "--sizes must be")):
    with pytest.raises(SystemExit):
      tune.main(args)
    assert what in capsys.readouterr().err


def test_tune_bad_machine_override_is_one_line(tmp_path) -> None:
  """A mistyped TINY_MACHINE field: argparse's usage error (status 2) naming it and the valid fields, no traceback."""
  import os
  import subprocess
  import sys
  env = {**os.environ, "TINY_MACHINE": "l4=1M", "TINY_CACHE_DIR": str(tmp_path), "DEBUG": "0"}
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.tune", "--list", "--sizes", "8", "--no-conv"],
                     capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  assert "Traceback" not in r.stderr and "'l4=1M'" in r.stderr and "l3_shared" in r.stderr, r.stderr
