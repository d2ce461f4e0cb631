"""tiny_uop.tools.find_tool: environment variable, then PATH, then a package that bundles the tool."""
import stat

import pytest
from tiny_uop import tools
from tiny_uop.tools import Bundled, Tool, find_tool, tool_status


def _exe(path, body="#!/bin/sh\necho hi\n"):
  path.write_text(body)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
  """A tool 'faketool' with env FAKETOOL, PATH name 'faketool', bundled by a fake installed distribution."""
  site = tmp_path / "site"
  (site / "fakebundle").mkdir(parents=True)
  _exe(site / "fakebundle" / "driver")
  info = site / "fakebundle-1.0.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakebundle\nVersion: 1.0\n")
  monkeypatch.syspath_prepend(str(site))
  monkeypatch.setenv("PATH", str(tmp_path / "bin"))
  monkeypatch.delenv("FAKETOOL", raising=False)
  (tmp_path / "bin").mkdir()
  monkeypatch.setitem(tools.TOOLS, "faketool", Tool("faketool", "FAKETOOL", ("faketool",),
                                                     (Bundled("fakebundle", ("fakebundle/missing", "fakebundle/driver"),
                                                              ("sub",)),)))
  return tmp_path


def test_bundled_tool_is_found_in_its_package(fake_tool):
  assert find_tool("faketool") == [str(fake_tool / "site" / "fakebundle" / "driver"), "sub"]
  assert find_tool("faketool", registry=False) is None


def test_path_wins_over_the_package(fake_tool):
  exe = _exe(fake_tool / "bin" / "faketool")
  assert find_tool("faketool") == [exe]


def test_env_wins_and_may_be_a_command_line(fake_tool, monkeypatch):
  _exe(fake_tool / "bin" / "faketool")
  other = _exe(fake_tool / "other")
  monkeypatch.setenv("FAKETOOL", f"{other} --flag")
  assert find_tool("faketool") == [other, "--flag"]


def test_nothing_found_says_how_to_get_it(fake_tool, monkeypatch):
  monkeypatch.setitem(tools.TOOLS, "faketool", Tool("faketool", "FAKETOOL", ("faketool",),
                                                     (Bundled("nosuchdist-xyz", ("a/b",)),)))
  assert find_tool("faketool") is None
  assert tool_status("faketool") == "faketool: not found ($FAKETOOL, PATH: faketool); pip install nosuchdist-xyz"


def test_unknown_tool_names_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown tool 'nope'; known: cc, clang, ld.lld, ptxas"): find_tool("nope")


def test_found_tools_run():
  """Every tool found here actually runs (the test environment installs ziglang, so cc/clang/ld.lld always are)."""
  import subprocess
  for name, flag in (("cc", "--version"), ("clang", "--version"), ("ld.lld", "--version")):
    cmd = find_tool(name)
    assert cmd is not None, tool_status(name)
    r = subprocess.run([*cmd, flag], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (cmd, r.stderr)
    if name == "ld.lld": assert "LLD" in r.stdout
