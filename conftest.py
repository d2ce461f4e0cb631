"""Test settings shared by every package's tests (pytest finds this file above all the test folders).

Hypothesis: no per-example deadline (CI machines have 2 busy cores; timing is not what property tests check), and
a derandomized profile under CI so a failure reproduces. Select another with ``--hypothesis-profile=NAME``.

Tools: under nox (``TINY_REQUIRE_TOOLS=1``), a test skipped because a tool is missing ("... not installed") fails
instead. nox installs every test toolchain from PyPI (``TEST_DEPS`` in noxfile.py; tiny_uop.tools finds them), so a
missing tool there is a broken setup, not a reason to run less than CI does.

Sessions: a test module or test marked ``@pytest.mark.dev_session("CPU")`` belongs to the sessions whose default
device (the device of ``DEV``'s first entry; no ``DEV``: CPU) is one of those named. In every other session it is
deselected at collection (counted as "deselected", never reported as a skip): the nox sessions for other devices
(``tiny-tensor@MOCK+AMD``, ...) leave it to the session it is pinned to, which runs it.
"""
import os
import re

import pytest

try:
  from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test dependency; without it only the tests that import it fail
  pass
else:
  settings.register_profile("dev", deadline=None)
  settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                            suppress_health_check=[HealthCheck.too_slow])
  settings.load_profile("ci" if os.environ.get("CI") else "dev")


def session_device() -> str:
  """The device a test session runs on by default: ``DEV``'s first entry without interface-free suffixes
  (``MOCK+AMD:LLVM:gfx942`` -> ``MOCK+AMD``, ``CPU:CLANG`` -> ``CPU``); CPU when ``DEV`` is unset or empty."""
  first = os.environ.get("DEV", "").split(";")[0].strip()
  return first.split(":")[0].upper() or "CPU"


def pytest_configure(config):
  config.addinivalue_line("markers", "dev_session(*devices): run only in the sessions whose default device (DEV's, "
                                     "else CPU) is one of these; deselected at collection elsewhere")


def pytest_collection_modifyitems(config, items):
  """Deselect the tests pinned (``dev_session``) to another session's device: they run there, not here."""
  dev = session_device()
  keep, drop = [], []
  for item in items:
    marks = list(item.iter_markers("dev_session"))
    if not marks: keep.append(item)
    elif any(not m.args for m in marks): raise pytest.UsageError(f"{item.nodeid}: dev_session() names no device")
    else: (keep if all(dev in (d.upper() for d in m.args) for m in marks) else drop).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


TOOL_SKIP = re.compile(r"not installed|no C compiler|apt-get install")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001
  outcome = yield
  rep = outcome.get_result()
  if not rep.skipped or os.environ.get("TINY_REQUIRE_TOOLS") != "1" or hasattr(rep, "wasxfail"): return
  reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
  if TOOL_SKIP.search(reason):
    rep.outcome = "failed"
    rep.longrepr = f"skipped for a missing tool, which nox installs from PyPI (noxfile.py TEST_DEPS): {reason}"


@pytest.fixture
def vector_registers(monkeypatch):
  """Set the CPU renderer's vector register file (count, bytes), whatever this host has: the CPU heuristics' register
  blocks and `gemm_panel` read it (`LLVMRenderer.vector_registers`). Call the returned function with (count, bytes),
  e.g. (16, 32) for AVX2, (32, 64) for AVX-512. The renderer's machine model (`LLVMRenderer.machine`) is pinned to
  `Machine.default` with that register file (the stated default caches: 1 MB L2, 32 MB L3 over 8 cores), so the
  cache-derived thresholds the tests assert don't follow the host."""
  from tiny_codegen.machine import Machine
  from tiny_uop.plugins import Device
  ren = Device["CPU"].renderer
  if not hasattr(ren, "vector_registers"): pytest.fail(f"{type(ren).__name__} has no vector_registers")

  def use(regs: int, width: int) -> None:
    monkeypatch.setattr(type(ren), "vector_registers", property(lambda self: (regs, width)))
    if hasattr(ren, "machine"):
      pinned = Machine.default(vector_bytes=width, vector_registers=regs)
      monkeypatch.setattr(type(ren), "machine", property(lambda self: pinned))
  return use
