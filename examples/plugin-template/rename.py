"""Make this template your plugin: ``python rename.py acme`` renames, in every file here and in the package folder,

    tiny-plugin-template  ->  tiny-acme       (the distribution: pip install tiny-acme)
    tiny_plugin_template  ->  tiny_acme       (the import package)
    TEMPLATE              ->  ACME            (the device name: DEV=ACME, Device["ACME"])
    TemplateDevice, ...   ->  AcmeDevice, ... (the classes)

Files whose name says ``template`` are renamed too (``tests/test_template_device.py`` -> ``tests/test_acme_device.py``),
and "a TEMPLATE" becomes "an ACME" where the new name starts with a vowel. Run it once, in a copy of this folder (not
inside tiny's repository). Standard library only.
"""
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent


def _article(m: re.Match, name: str) -> str:
  """'a TEMPLATE' -> 'an ACME' / 'a ZETA': the article the new device name needs, capitalized as it was."""
  art = "an" if name[0] in "aeiou" else "a"
  return (art.capitalize() if m.group(1)[0] == "A" else art) + " " + name.upper()


def rename(name: str, root: pathlib.Path = HERE) -> None:
  """Rename the template in `root` to `name` (see the module docstring): file contents, file names, the package."""
  if not re.fullmatch(r"[a-z][a-z0-9]*", name):
    raise SystemExit(f"rename.py: {name!r} is not a plain lower-case name such as 'acme' (letters and digits)")
  if not (root / "tiny_plugin_template").is_dir():
    raise SystemExit(f"rename.py: {root / 'tiny_plugin_template'} is missing: already renamed?")
  subs = [(re.compile(r"tiny-plugin-template"), f"tiny-{name}"), (re.compile(r"tiny_plugin_template"), f"tiny_{name}"),
          (re.compile(r"\b([Aa]n?) TEMPLATE\b"), lambda m: _article(m, name)),
          (re.compile(r"\bTEMPLATE\b"), name.upper()), (re.compile(r"\bTemplate(?=[A-Z])"), name.capitalize()),
          (re.compile(r"\btest_template_"), f"test_{name}_")]
  for path in sorted(root.rglob("*")):
    if not path.is_file() or path.suffix not in (".py", ".toml", ".md") or path.name == "rename.py": continue
    if any(part in ("build", "dist", "__pycache__") or part.endswith(".egg-info") for part in path.parts): continue
    text = path.read_text()
    for pat, new in subs: text = pat.sub(new, text)
    path.write_text(text)
  for path in sorted(root.rglob("*template*"), key=lambda p: -len(p.parts)):  # deepest first: files, then folders
    if path.name == "tiny_plugin_template" or any(part in ("build", "dist") for part in path.parts): continue
    path.rename(path.with_name(path.name.replace("template", name)))
  (root / "tiny_plugin_template").rename(root / f"tiny_{name}")
  print(f"renamed: distribution tiny-{name}, package tiny_{name}, device {name.upper()}")


if __name__ == "__main__":
  if len(sys.argv) != 2: raise SystemExit(__doc__)
  rename(sys.argv[1])
