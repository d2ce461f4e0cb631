"""PTX text -> one kernel's declarations and statements (parsed once per kernel, then compiled by `compile.py`).

Handles what PTXRenderer and LLVM's NVPTX backend write: the module header (`.version`, `.target`,
`.address_size`), module-scope `.shared` arrays, `.visible .entry name(.param ...)`, `.reg` declarations with `<N>`
ranges, `.shared` / `.local` arrays, `{ }` scopes, labels, predicated statements (`@%p`, `@!%p`), vector operands
(`{%f1, %f2}`) and addresses (`[%rd1+16]`). Comments are dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


class PTXParseError(ValueError):
  """PTX text the executor cannot read (no such entry, malformed statement)."""


@dataclass(frozen=True)
class Param:
  """One kernel parameter: name, PTX type, byte offset in the parameter buffer, size in bytes."""
  name: str
  type: str
  offset: int
  size: int


@dataclass(frozen=True)
class Stmt:
  """One instruction: opcode with its modifiers (`ld.global.v4.f32`), operands, guard predicate, source line."""
  op: str
  args: tuple[str, ...]
  pred: str | None
  neg: bool
  line: str


@dataclass
class Entry:
  """A parsed `.entry`: parameters, registers (name -> PTX type), shared/local arrays, statements and labels."""
  name: str
  params: list[Param]
  param_size: int
  regs: dict[str, str] = field(default_factory=dict)
  shared: dict[str, int] = field(default_factory=dict)     # symbol -> byte offset in the block's shared memory
  shared_size: int = 0
  dynamic_shared: str | None = None                        # `.extern .shared` symbol: starts at shared_size
  local: dict[str, int] = field(default_factory=dict)      # symbol -> byte offset in a thread's local memory
  local_size: int = 0
  stmts: list[Stmt] = field(default_factory=list)
  labels: dict[str, int] = field(default_factory=dict)     # label -> index of the next statement
  elem_size: dict[str, int] = field(default_factory=dict)  # shared/local array -> bytes per element


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_TYPE_SIZE = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4,
              "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "pred": 1}
_ARRAY = re.compile(r"\.(shared|local)\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$]+)\s*\[(\d*)\]")
_REG = re.compile(r"\.reg\s+(?:\.v\d\s+)?\.(\w+)\s+(.+)")


def split_operands(s: str) -> list[str]:
  """Split on the commas that are not inside `{}` or `[]`."""
  out: list[str] = []
  cur: list[str] = []
  depth = 0
  for ch in s:
    if ch in "{[": depth += 1
    elif ch in "}]": depth -= 1
    if ch == "," and depth == 0:
      out.append("".join(cur).strip())
      cur = []
    else: cur.append(ch)
  if "".join(cur).strip(): out.append("".join(cur).strip())
  return out


def _matching(text: str, i: int, open_: str, close: str) -> int:
  """Index of the bracket closing the one at `text[i]`."""
  depth = 0
  for j in range(i, len(text)):
    if text[j] == open_: depth += 1
    elif text[j] == close:
      depth -= 1
      if depth == 0: return j
  raise PTXParseError(f"unbalanced {open_!r} in PTX")


def _align(x: int, a: int) -> int: return (x + a - 1) // a * a


def _params(text: str) -> tuple[list[Param], int]:
  out, off = [], 0
  for p in split_operands(text):
    m = re.match(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(?:\.ptr\s+(?:\.\w+\s+)*?(?:\.align\s+\d+\s+)?)?"
                 r"([\w$]+)\s*(?:\[(\d+)\])?$", p.strip())
    if m is None: raise PTXParseError(f"can't read kernel parameter {p.strip()!r}")
    align, typ, name, count = m.groups()
    if typ not in _TYPE_SIZE: raise PTXParseError(f"parameter {name}: unknown type .{typ}")
    size = _TYPE_SIZE[typ] * (int(count) if count else 1)
    off = _align(off, int(align) if align else _TYPE_SIZE[typ])
    out.append(Param(name, typ, off, size))
    off += size
  return out, off


def _module_scope(text: str) -> str:
  """`text` without the bodies (`{...}`) of its functions and kernels."""
  out, i = [], 0
  while (j := text.find("{", i)) >= 0:
    out.append(text[i:j])
    i = _matching(text, j, "{", "}") + 1
  return "".join(out) + text[i:]


def _declare(e: Entry, decl: str) -> bool:
  """Handle a declaration statement; False when `decl` is an instruction."""
  if decl.startswith(".reg"):
    m = _REG.match(decl)
    if m is None: raise PTXParseError(f"can't read {decl!r}")
    typ, names = m.groups()
    for nm in split_operands(names):
      if (r := re.fullmatch(r"(%[\w$]+)<(\d+)>", nm)):
        for i in range(int(r.group(2))): e.regs[f"{r.group(1)}{i}"] = typ
      else: e.regs[nm] = typ
    return True
  if (m := _ARRAY.search(decl)) and (decl.startswith((".shared", ".local", ".extern"))):
    space, align, typ, name, count = m.groups()
    a = int(align) if align else _TYPE_SIZE.get(typ, 1)
    if decl.startswith(".extern") or count == "":
      e.dynamic_shared = name
      return True
    size = _TYPE_SIZE.get(typ, 1) * int(count)
    e.elem_size[name] = _TYPE_SIZE.get(typ, 1)
    if space == "shared":
      e.shared_size = _align(e.shared_size, a)
      e.shared[name] = e.shared_size
      e.shared_size += size
    else:
      e.local_size = _align(e.local_size, a)
      e.local[name] = e.local_size
      e.local_size += size
    return True
  return decl.startswith((".pragma", ".loc", ".file", ".maxntid", ".reqntid", ".minnctapersm", ".maxnreg",
                          ".section", ".noreturn", ".explicitcluster", ".maxclusterrank", ".reqnctapercluster"))


def parse_entry(ptx: str, name: str) -> Entry:
  """Parse the `.entry` called `name` of module `ptx` (PTXParseError when there is none)."""
  text = _COMMENTS.sub("", ptx)
  m = re.search(rf"\.entry\s+{re.escape(name)}\s*\(", text)
  if m is None:
    names = re.findall(r"\.entry\s+([\w$]+)", text)
    raise PTXParseError(f"no .entry {name!r} in the PTX; entries: {', '.join(names) or 'none'}")
  pend = _matching(text, m.end() - 1, "(", ")")
  params, psize = _params(text[m.end():pend])
  bstart = text.index("{", pend)
  body = text[bstart + 1:_matching(text, bstart, "{", "}")]
  e = Entry(name, params, psize)
  # module-scope shared arrays (LLVM puts addrspace(3) globals there): every kernel of the module sees them
  for stmt in _module_scope(text).split(";"):
    if ".shared" in stmt: _declare(e, stmt[stmt.index(".extern") if ".extern" in stmt else stmt.index(".shared"):])
  for raw in body.split(";"):
    s = raw.strip()
    while True:  # labels (several may precede one statement) and the braces of `{ }` scopes
      if (lm := re.match(r"([\w$]+):", s)):
        e.labels[lm.group(1)] = len(e.stmts)
        s = s[lm.end():].strip()
      elif s[:1] in ("{", "}"): s = s[1:].strip()
      else: break
    if not s or _declare(e, s): continue
    pred, neg = None, False
    if s.startswith("@"):
      g, s = s.split(None, 1)
      neg, pred = g.startswith("@!"), g.lstrip("@!")
    op, _, rest = s.replace("\t", " ").partition(" ")
    rest = rest.strip()
    e.stmts.append(Stmt(op, tuple(split_operands(rest)) if rest else (), pred, neg, s))
  return e
