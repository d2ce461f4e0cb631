"""The shared core of the GPU runtimes' selftests (`tiny_uop.plugins.selftest`), with a fake runtime: the exit status
(2 without a GPU, 1 when a check fails or numpy is missing, 0 otherwise), what it prints, and the numeric check
against a relative error worked out by hand. The real runtimes' runs are in their own tests/test_selftest.py."""
import math
import sys
import uuid

import pytest

from tiny_uop.helpers import Context
from tiny_uop.plugins import selftest, unregister_device


def _spec(probe=lambda: ([], [], []), devices=None, **kw) -> selftest.SelfTest:
  def no_compile(ast, renderer): raise AssertionError("nothing should compile in these tests")
  return selftest.SelfTest(gpu="FAKE GPU", devices=devices or {}, probe=probe, mock_devices=lambda: list(devices or {}),
                           describe=lambda dev, d: "fake", get_program=no_compile, **kw)


def test_no_gpu_exits_2_saying_why(capsys):
  spec = _spec(probe=lambda: (["FAKE: /dev/fakectl present"], ["/dev/fake0 missing (driver not loaded)"], []))
  assert selftest.main(spec, []) == 2
  out, err = capsys.readouterr()
  assert out == "FAKE: /dev/fakectl present\n"
  assert err == "no FAKE GPU usable here:\n  /dev/fake0 missing (driver not loaded)\n"


def test_missing_numpy_exits_1_saying_so(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "numpy", None)  # importlib.util.find_spec("numpy") is None: not installed
  assert selftest.main(_spec(), ["--mock"]) == 1
  assert "compares kernels against numpy, which is not installed: pip install numpy" in capsys.readouterr().err


@pytest.mark.parametrize("fails, status", [(True, 1), (False, 0)])
def test_a_device_that_does_not_open(tmp_path, monkeypatch, capsys, fails, status):
  pytest.importorskip("numpy")  # main checks for it before opening anything
  mod = f"selftest_fakedev_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{mod}.py").write_text("class Dev:\n  def __init__(self, name): raise RuntimeError('/dev/fake0 busy')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  name = f"SELFTESTFAKE{uuid.uuid4().hex[:6].upper()}"
  with Context(DEV="", TINY_PLUGINS=""):
    try: code = selftest.main(_spec(devices={name: f"{mod}:Dev"}, unavailable_fails=fails), ["--mock"])
    finally: unregister_device(name)
  out = capsys.readouterr().out
  assert code == status
  assert f"{name}: unavailable: " in out and "/dev/fake0 busy" in out
  assert f"selftest {'FAILED' if fails else 'passed'} in " in out


def test_check_prints_the_relative_error(capsys):
  np = pytest.importorskip("numpy")
  want = np.array([1.0, -2.0, 4.0])
  got = np.array([1.0, -2.0, 4.004], dtype=np.float32)
  err = abs(float(np.float32(4.004)) - 4.0) / 4.0  # max |got - want| / max |want|, by hand
  assert math.isclose(err, 1e-3, rel_tol=1e-4)
  assert selftest.check("close", got, want, 2e-3) is True
  assert selftest.check("too far", got, want, 5e-4) is False
  assert selftest.check("nan", np.array([math.nan, 0, 0], dtype=np.float32), want, 1.0) is False
  assert selftest.check("empty", np.zeros(0), np.zeros(0), 0.0) is True
  assert capsys.readouterr().out.splitlines() == [
    f"  ok   {'close':28s} rel err {err:.2e} (tol 0.002)", f"  FAIL {'too far':28s} rel err {err:.2e} (tol 0.0005)",
    f"  FAIL {'nan':28s} rel err nan (tol 1)", f"  ok   {'empty':28s} rel err 0.00e+00 (tol 0)"]
