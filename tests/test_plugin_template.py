"""The plugin template as a third party uses it: copy examples/plugin-template out of the repository, rename it with
its rename.py, build it, install it into a fresh venv, and run its own tests (tiny's conformance suite included).

The fresh venv gets tiny's packages the way the template's README says (wheels built from this checkout, installed by
pip with ``--find-links``, no index). Its third-party dependencies (numpy, llvmlite, pytest) are this environment's,
linked in through a .pth file, so the test needs no network and takes seconds instead of downloading them again.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "plugin-template"
TINY = ["tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-tensor"]  # what the plugin and its tests need
THIRD_PARTY = ["numpy", "llvmlite", "pytest"]  # and what they require

pytestmark = pytest.mark.integration


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
  env = {**os.environ, "DEV": "", "TINY_PLUGINS": "", "PYTHONDONTWRITEBYTECODE": "1",
         "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", **kw.pop("env", {})}
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
  assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
  return r


def _closure(names: list[str]) -> list[importlib.metadata.Distribution]:
  """The installed distributions `names` and everything they require (no extras), as installed here."""
  from packaging.requirements import Requirement
  seen: dict[str, importlib.metadata.Distribution] = {}
  todo = list(names)
  while todo:
    name = todo.pop()
    dist = importlib.metadata.distribution(name)
    if (key := dist.metadata["Name"].lower().replace("_", "-")) in seen: continue
    seen[key] = dist
    for req in map(Requirement, dist.requires or ()):
      if req.marker is None or req.marker.evaluate({"extra": ""}): todo.append(req.name)
  return list(seen.values())


def _link_third_party(dest: Path) -> None:
  """Symlink the installed files (top-level folders/modules and dist-info) of THIRD_PARTY and what they require
  into `dest`."""
  dest.mkdir()
  for dist in _closure(THIRD_PARTY):
    tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    for top in tops:
      src = Path(str(dist.locate_file(top)))
      if src.exists() and not (dest / top).exists() and "bin" != top: (dest / top).symlink_to(src)


@pytest.fixture(scope="module")
def acme(tmp_path_factory) -> tuple[Path, str]:
  """The template copied out, renamed to 'acme', and installed into a fresh venv: (its folder, the venv's python)."""
  tmp = tmp_path_factory.mktemp("plugin")
  src = tmp / "tiny-acme"
  shutil.copytree(TEMPLATE, src, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
  _run([sys.executable, "rename.py", "acme"], cwd=src)
  wheels = tmp / "wheels"
  # tiny's wheels from this checkout and the plugin's: hatchling from this environment, no build isolation, no index
  _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
        *[str(ROOT / "packages" / p) for p in TINY], str(src)])
  venv = tmp / "venv"
  _run([sys.executable, "-m", "venv", str(venv)])
  py = str(venv / "bin" / "python")
  site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
  _link_third_party(tmp / "third-party")
  (site / "_third_party.pth").write_text(str(tmp / "third-party") + "\n")
  _run([py, "-m", "pip", "install", "-q", "--find-links", str(wheels), "tiny-acme[test]"])
  return src, py


def test_renamed_everywhere(acme):
  src, _ = acme
  assert (src / "tiny_acme" / "device.py").is_file() and not (src / "tiny_plugin_template").exists()
  for f in src.rglob("*"):
    if f.is_file() and f.name != "rename.py" and f.suffix in (".py", ".toml", ".md"):
      text = f.read_text()  # (the README may still say where the template lives in tiny: examples/plugin-template)
      assert "tiny_plugin_template" not in text and "tiny-plugin-template" not in text and "TEMPLATE" not in text, f


def test_installed_from_wheels_in_the_venv(acme):
  """tiny comes from the venv's site-packages (the wheels), not from this checkout."""
  _, py = acme
  code = ("import tiny_uop, tiny_tensor, tiny_acme; "
          "print(all('site-packages' in m.__file__ for m in (tiny_uop, tiny_tensor, tiny_acme)))")
  assert _run([py, "-c", code], cwd="/").stdout.strip() == "True"


def test_listed_by_the_plugin_cli(acme):
  _, py = acme
  rows = {r["name"]: r for r in json.loads(_run([py, "-m", "tiny_uop.plugins", "--json"], cwd="/").stdout)}
  assert (rows["ACME"]["package"], rows["ACME"]["version"], rows["ACME"]["status"]) == ("tiny-acme", "0.1.0", "ok")


def test_its_own_tests_pass(acme):
  """The plugin's tests: descriptor, cheap import, a tensor program, and the conformance suite."""
  src, py = acme
  r = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=src)
  assert " passed" in r.stdout and "failed" not in r.stdout and "skipped" not in r.stdout, r.stdout


def test_conformance_cli(acme):
  _, py = acme
  out = _run([py, "-m", "tiny_tensor.conformance", "--device", "ACME", "--only", "views,jit"], cwd="/").stdout
  rows = [line.split() for line in out.splitlines()]
  assert ["views", "views", "of", "realized", "buffers", "pass"] in [r[:6] for r in rows], out
  assert out.splitlines()[-1] == "7 passed, 0 failed, 0 n/a", out


def test_template_is_not_in_this_environment():
  """The install went to the venv only: this test's own environment does not list the plugin."""
  names = {ep.name for ep in importlib.metadata.entry_points(group="tiny.devices")}
  assert "TEMPLATE" not in names and "ACME" not in names
