"""Importing tiny's packages scans no entry point and imports no runtime plugin (docs/ARCHITECTURE.md §2)."""
import subprocess
import sys


RUNTIMES = ("tiny_runtime_cpu", "tiny_runtime_amd", "tiny_runtime_nv", "tiny_runtime_qcom")
CHECK = """
import sys, {mod}
import tiny_uop.plugins
loaded = sorted(m for m in sys.modules if m.split('.')[0] in {runtimes!r})
print("scanned" if tiny_uop.plugins._registry._scanned else "not scanned", loaded)
"""


def _run(mod: str) -> str:
  r = subprocess.run([sys.executable, "-c", CHECK.format(mod=mod, runtimes=RUNTIMES)], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  return r.stdout.strip()


def test_import_tiny_uop_imports_no_runtime():
  assert _run("tiny_uop") == "not scanned []"


def test_import_tiny_tensor_imports_no_runtime():
  assert _run("tiny_tensor") == "not scanned []"
