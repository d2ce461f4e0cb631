"""Install examples/plugin-template into a fresh venv and check tiny discovers and opens its TEMPLATE device.

The venv sees the packages of the environment running this test (the editable tiny packages, hatchling) through a
.pth file that calls ``site.addsitedir`` on this environment's site-packages: ``python -m venv
--system-site-packages`` would only expose the base interpreter's, not those of a venv such as nox's.
"""
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "plugin-template"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> str:
  venv = tmp_path_factory.mktemp("plugin-venv") / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  py = venv / "bin" / "python"
  site_dir = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
  parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
  (Path(site_dir) / "_tiny_parent_env.pth").write_text(
    "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents) + "\n")
  # --no-build-isolation: build with the hatchling we have, no index needed; --no-deps: tiny comes from the parent
  isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
  r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", *isolation,
                      str(TEMPLATE)], capture_output=True, text=True)
  assert r.returncode == 0, f"pip install of the template failed:\n{r.stdout}\n{r.stderr}"
  return str(py)


def _run(py: str, code: str, **env: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "DEV": "", "TINY_PLUGINS": "", **env}
  return subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=str(TEMPLATE.parent))


def test_template_is_discovered(venv_python):
  r = subprocess.run([venv_python, "-m", "tiny_uop.plugins", "--json"], capture_output=True, text=True,
                     env={**os.environ, "DEV": "", "TINY_PLUGINS": ""})
  assert r.returncode == 0, r.stderr
  rows = {row["name"]: row for row in json.loads(r.stdout) if row["kind"] == "device"}
  assert "TEMPLATE" in rows, f"TEMPLATE not discovered; devices: {sorted(rows)}"
  assert (rows["TEMPLATE"]["package"], rows["TEMPLATE"]["version"]) == ("tiny-plugin-template", "0.1.0")
  r = _run(venv_python, "from tiny_uop.plugins import Device; p = Device.plugin('TEMPLATE');"
                        "print(p.target, p.default_ok, 'TEMPLATE' in Device.installed())")
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["tiny_plugin_template.device:TemplateDevice", "False", "True"]


def test_template_is_not_in_this_environment():
  """The install went to the venv only: this test's own environment does not list TEMPLATE."""
  from importlib.metadata import entry_points
  assert "TEMPLATE" not in {ep.name for ep in entry_points(group="tiny.devices")}


def test_template_opens(venv_python):
  r = _run(venv_python, "from tiny_uop.plugins import Device; from tiny_runtime_cpu.cpu import CPUDevice\n"
                        "d = Device['TEMPLATE']; print(type(d).__name__, isinstance(d, CPUDevice))")
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["TemplateDevice", "True"]


def test_template_runs_a_tensor_program(venv_python):
  r = _run(venv_python, "from tiny_tensor import Tensor\n"
                        "t = Tensor([1, 2, 3], device='TEMPLATE') + 1\nprint(t.device, t.tolist())")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "TEMPLATE [2, 3, 4]"
  r = _run(venv_python, "from tiny_tensor import Tensor\nprint((Tensor([1, 2, 3]) * 2).tolist())", DEV="TEMPLATE")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "[2, 4, 6]"
