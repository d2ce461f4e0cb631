"""`nox -s typecheck` checks every module of the eight packages (issue #33): the root pyproject.toml excuses none
(no `[[tool.mypy.overrides]]` with `ignore_errors` or a disabled error code for our own modules) and no source file
excuses itself (`# mypy: ignore-errors`, or a file-wide `# type: ignore` before its first statement)."""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("tiny_uop", "tiny_codegen", "tiny_runtime_cpu", "tiny_runtime_amd", "tiny_runtime_nv",
                "tiny_runtime_qcom", "tiny_tensor", "tiny_torch")
EXCUSING_KEYS = {"ignore_errors", "disable_error_code", "follow_imports", "check_untyped_defs"}


def test_no_mypy_override_excuses_one_of_our_modules():
  cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
  bad = []
  for ov in cfg.get("overrides", []):
    mods = [ov["module"]] if isinstance(ov["module"], str) else ov["module"]
    ours = [m for m in mods if m.split(".")[0] in OUR_PACKAGES]
    if ours and EXCUSING_KEYS & set(ov): bad.append((ours, sorted(EXCUSING_KEYS & set(ov))))
  assert not bad, f"modules excused from mypy in pyproject.toml (fix their errors instead): {bad}"
  assert cfg.get("check_untyped_defs") is True  # the bodies of unannotated functions are checked too


def test_no_source_file_excuses_itself():
  bad = []
  for pkg in OUR_PACKAGES:
    for f in sorted((ROOT / "packages" / pkg.replace("_", "-") / pkg).rglob("*.py")):
      src = f.read_text()
      body = ast.parse(src).body
      head = src.splitlines()[:body[0].lineno - 1] if body else src.splitlines()
      if re.search(r"#\s*mypy:\s*ignore-errors", src) or any(re.match(r"\s*#\s*type:\s*ignore", ln) for ln in head):
        bad.append(str(f.relative_to(ROOT)))
  assert not bad, f"source files that turn mypy off for themselves: {bad}"
