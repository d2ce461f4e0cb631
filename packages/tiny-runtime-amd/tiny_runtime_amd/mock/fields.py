"""Bit fields of command-packet dwords and registers, decoded the way hardware reads them.

A `Layout` lists the fields of one 32-bit word; every bit no field covers is reserved and must be zero. A field may
list its valid values (an enumeration): any other value is one the hardware defines as reserved, and is rejected.
Errors (`PacketError`) name the packet, the dword, the field or the bits, the value and what is valid.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class MockGPUError(RuntimeError):
  """Something a real GPU would reject, fault on or hang on; raised by the mock instead."""


class PacketError(MockGPUError):
  """A malformed command packet: unknown opcode, wrong length, reserved bits set, a reserved field value."""


@dataclass(frozen=True)
class Field:
  """`width` bits at bit `lo`; `values`: the valid values and their names (None: any value)."""
  name: str
  lo: int
  width: int = 1
  values: dict[int, str] | None = None

  @property
  def mask(self) -> int: return ((1 << self.width) - 1) << self.lo

  def get(self, word: int) -> int: return (word >> self.lo) & ((1 << self.width) - 1)

  def name_of(self, v: int) -> str: return f"{v} ({self.values[v]})" if self.values and v in self.values else str(v)

  def valid_list(self) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(self.values.items())) if self.values else "any"


@dataclass(frozen=True)
class Layout:
  """The fields of one 32-bit word. `decode` checks reserved bits and enumerations and returns {name: value}."""
  fields: tuple[Field, ...] = ()
  valid: int = field(init=False)

  def __post_init__(self) -> None:
    m = 0
    for f in self.fields:
      if m & f.mask: raise ValueError(f"field {f.name} overlaps another field")
      m |= f.mask
    object.__setattr__(self, "valid", m)

  def decode(self, word: int, where: str) -> dict[str, int]:
    """The field values of `word`; PacketError for a reserved bit or a reserved enumeration value. `where` says
    which packet and dword, for the message."""
    if (bad := word & ~self.valid & 0xFFFFFFFF):
      bits = [i for i in range(32) if bad >> i & 1]
      raise PacketError(f"{where}: reserved bit(s) {bits} set in {word:#010x}; they must be 0 (valid fields: "
                        f"{', '.join(f'{f.name}[{f.lo + f.width - 1}:{f.lo}]' for f in self.fields) or 'none'})")
    out = {}
    for f in self.fields:
      v = (word >> f.lo) & ((1 << f.width) - 1)
      if f.values is not None and v not in f.values:
        raise PacketError(f"{where}: {f.name} = {v} is reserved; valid: {f.valid_list()}")
      out[f.name] = v
    return out


ANY32 = Layout((Field("value", 0, 32),))


def require(cond: object, where: str, what: str) -> None:
  """PacketError(`where: what`) unless `cond`: for values the hardware accepts but this mock does not model."""
  if not cond: raise PacketError(f"{where}: {what}")
