"""tiny-tensor's packaging: installed with its dependencies; importing it opens no device."""
import importlib.metadata
import subprocess
import sys


def test_installed():
  assert importlib.metadata.version("tiny-tensor") == "0.1.0"
  reqs = importlib.metadata.requires("tiny-tensor") or []
  assert any(r.startswith("tiny-runtime-cpu") for r in reqs) and any(r.startswith("numpy") for r in reqs)


def test_import_opens_no_device():
  code = ("import sys, tiny_tensor, tiny_uop.plugins as p\n"
          "print(p.Device._opened, sorted(m for m in sys.modules if m.startswith('tiny_runtime')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "{} []"
