"""The documentation is in the repository and agrees with the code: no reference to files outside the repository,
every relative link resolves, and docs/PLUGINS.md covers every member of the device interfaces."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".nox", "build", "dist", "__pycache__", ".venv"}


def _text_files():
  for d, dirs, files in os.walk(ROOT):
    dirs[:] = [x for x in dirs if x not in SKIP and not x.endswith(".egg-info")]
    for f in files:
      p = Path(d) / f
      if p.suffix not in (".py", ".md", ".toml", ".txt", ""): continue
      try: yield p, p.read_text()
      except UnicodeDecodeError: continue


def test_nothing_refers_to_files_outside_the_repository():
  bad = []
  for p, text in _text_files():
    if p == Path(__file__): continue
    for m in re.finditer(r"\.\./shared|shared/design|\.\./\.\./\.\./", text):
      bad.append(f"{p.relative_to(ROOT)}: {m[0]}")
  assert not bad, bad


def test_design_docs_are_named_by_their_place():
  """`ARCHITECTURE.md` and friends are docs/ files; code names them with the folder (docs/ARCHITECTURE.md §N)."""
  for name in ("ARCHITECTURE.md", "PIPELINE.md", "PLUGINS.md"): assert (ROOT / "docs" / name).is_file(), name
  bad = []
  for p, text in _text_files():
    if p.suffix != ".py" or p == Path(__file__): continue
    for m in re.finditer(r"(\S*)\b(ARCHITECTURE(\.md)?|PLUGINS\.md)", text):
      if not m[1].endswith("docs/"): bad.append(f"{p.relative_to(ROOT)}: {m[0]}")
  assert not bad, bad


def test_markdown_links_resolve():
  bad = []
  for p, text in _text_files():
    if p.suffix != ".md": continue
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
      if re.match(r"[a-z]+:", target): continue  # a URL
      if not (p.parent / target).exists(): bad.append(f"{p.relative_to(ROOT)}: {target}")
  assert not bad, bad


def _members(cls: type) -> set[str]:
  own = {n for n in vars(cls) if not n.startswith("__") or n in ("__init__", "__call__")}
  return {n for n in own if n not in ("__annotations__", "__dict__", "__weakref__", "__module__", "__doc__",
                                       "__orig_bases__", "__parameters__")}


@pytest.mark.parametrize("name", ["Compiled", "Allocator", "Program", "Compiler", "Renderer"])
def test_plugins_md_covers_the_interfaces(name):
  import tiny_uop.device as d
  doc = (ROOT / "docs" / "PLUGINS.md").read_text()
  missing = [m for m in sorted(_members(getattr(d, name))) if f"`{m}" not in doc and m not in ("__init__",)]
  assert not missing, f"docs/PLUGINS.md does not describe {name}.{', '.join(missing)}"


def test_plugins_md_states_the_current_api():
  from tiny_uop.plugins import PLUGIN_API, DevicePlugin
  doc = (ROOT / "docs" / "PLUGINS.md").read_text()
  assert f"now `{PLUGIN_API}`" in doc
  for field in DevicePlugin.__dataclass_fields__: assert f"| `{field}` |" in doc, field
