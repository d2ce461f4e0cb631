"""Make this template your plugin: ``python rename.py acme`` renames, in every file here and in the package folder,

    tiny-plugin-template  ->  tiny-acme       (the distribution: pip install tiny-acme)
    tiny_plugin_template  ->  tiny_acme       (the import package)
    TEMPLATE              ->  ACME            (the device name: DEV=ACME, Device["ACME"])
    TemplateDevice, ...   ->  AcmeDevice, ... (the classes)

Run it once, in a copy of this folder. Standard library only.
"""
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent


def rename(name: str, root: pathlib.Path = HERE) -> None:
  if not re.fullmatch(r"[a-z][a-z0-9]*", name):
    raise SystemExit(f"rename.py: {name!r} is not a plain lower-case name such as 'acme' (letters and digits)")
  if not (root / "tiny_plugin_template").is_dir():
    raise SystemExit(f"rename.py: {root / 'tiny_plugin_template'} is missing: already renamed?")
  subs = [(re.compile(r"tiny-plugin-template"), f"tiny-{name}"), (re.compile(r"tiny_plugin_template"), f"tiny_{name}"),
          (re.compile(r"\bTEMPLATE\b"), name.upper()), (re.compile(r"\bTemplate(?=[A-Z])"), name.capitalize())]
  for path in sorted(root.rglob("*")):
    if not path.is_file() or path.suffix not in (".py", ".toml", ".md") or path.name == "rename.py": continue
    if any(part in ("build", "dist", "__pycache__") or part.endswith(".egg-info") for part in path.parts): continue
    text = path.read_text()
    for pat, new in subs: text = pat.sub(new, text)
    path.write_text(text)
  (root / "tiny_plugin_template").rename(root / f"tiny_{name}")
  print(f"renamed: distribution tiny-{name}, package tiny_{name}, device {name.upper()}")


if __name__ == "__main__":
  if len(sys.argv) != 2: raise SystemExit(__doc__)
  rename(sys.argv[1])
