"""Tests for `Target.parse`: the DEV string grammar."""
import pytest

from tiny_uop.target import Target


@pytest.mark.parametrize("s, device, renderer, arch, interface, indices", [
  ("CPU", "CPU", None, None, None, ()),
  ("CPU:LLVM", "CPU", "LLVM", None, None, ()),
  ("CPU:CLANG", "CPU", "CLANG", None, None, ()),
  ("cpu:llvm", "CPU", "LLVM", None, None, ()),
  ("PYTHON", "PYTHON", None, None, None, ()),
  ("NULL:PTX:sm_90", "NULL", "PTX", "sm_90", None, ()),
  ("AMD:LLVM:gfx1100", "AMD", "LLVM", "gfx1100", None, ()),
  ("MOCK+AMD", "AMD", None, None, "MOCK", ()),
  ("mock+amd:llvm:gfx1100", "AMD", "LLVM", "gfx1100", "MOCK", ()),
  ("NV:PTX", "NV", "PTX", None, None, ()),
  ("CUDA", "CUDA", None, None, None, ()),
  ("QCOM", "QCOM", None, None, None, ()),
  ("CL", "CL", None, None, None, ()),
  ("CPU:1", "CPU", None, None, None, (1,)),
  ("NV:2:PTX:sm_80", "NV", "PTX", "sm_80", None, (2,)),
  ("AMD:0,1", "AMD", None, None, None, (0, 1)),
  (" CPU ", "CPU", None, None, None, ()),
])
def test_parse(s, device, renderer, arch, interface, indices):
  t = Target.parse(s)
  assert (t.device, t.renderer, t.arch, t.interface, t.indices, t.path) == (device, renderer, arch, interface,
                                                                            indices, None)


def test_disk_keeps_path():
  t = Target.parse("DISK:/tmp/x.bin")
  assert (t.device, t.path, t.renderer, t.indices) == ("DISK", "/tmp/x.bin", None, ())
  assert t.name == "DISK:/tmp/x.bin"
  # a path may itself contain ':' and digits; none of it is a renderer or an index
  t = Target.parse("disk:C:/data/1:2.bin")
  assert (t.device, t.path) == ("DISK", "C:/data/1:2.bin")
  assert Target.parse("DISK") == Target("DISK")


@pytest.mark.parametrize("s, name", [
  ("CPU", "CPU"), ("CPU:0", "CPU"), ("CPU:1", "CPU:1"), ("cpu:llvm", "CPU"), ("MOCK+AMD", "MOCK+AMD"),
  ("NV:3:PTX", "NV:3"), ("DISK:/x", "DISK:/x"),
])
def test_canonical_name(s, name):
  assert Target.parse(s).name == name


def test_names_several_indices():
  t = Target.parse("AMD:0,2")
  assert t.names == ("AMD", "AMD:2")
  with pytest.raises(ValueError, match="names 2 devices"): t.name


@pytest.mark.parametrize("s", ["CPU", "CPU:LLVM", "NULL:PTX:sm_90", "MOCK+AMD:LLVM:gfx1100", "NV:2:PTX",
                               "DISK:/tmp/x.bin", "AMD:0,1"])
def test_str_roundtrip(s):
  assert str(Target.parse(s)) == s
  assert Target.parse(str(Target.parse(s))) == Target.parse(s)


def test_parse_list():
  ts = Target.parse_list("AMD:LLVM;CPU")
  assert [t.device for t in ts] == ["AMD", "CPU"] and ts[0].renderer == "LLVM"
  assert Target.parse_list("CPU") == (Target("CPU"),)


@pytest.mark.parametrize("s, why", [
  ("", "empty"),
  ("   ", "empty"),
  ("CPU:LLVM:x86:extra", "too many"),
  ("1CPU", "device '1CPU' is not a name"),
  ("CP U", "not a name"),
  ("CPU:LL-VM", "renderer 'LL-VM' is not a name"),
  ("AMD:LLVM:gfx 1100", "arch"),
  ("+AMD", "interface '' is not a name"),
  ("MOCK+", "device '' is not a name"),
  ("MOCK+DISK:/x", "DISK takes no interface"),
  ("DISK:", "needs a path"),
  ("CPU;AMD", "parse_list"),
])
def test_parse_errors_name_the_string_and_grammar(s, why):
  with pytest.raises(ValueError) as e: Target.parse(s)
  msg = str(e.value)
  assert repr(s) in msg and why in msg and "[IFACE+]DEVICE" in msg


def test_parse_list_errors():
  with pytest.raises(ValueError, match="empty entry"): Target.parse_list("CPU;;AMD")
  with pytest.raises(ValueError, match="'CPU:a:b:c'"): Target.parse_list("AMD;CPU:a:b:c")


def test_not_a_string():
  with pytest.raises(TypeError, match="got int"): Target.parse(3)  # type: ignore[arg-type]


def test_frozen():
  t = Target.parse("CPU")
  with pytest.raises(AttributeError): t.device = "AMD"  # type: ignore[misc]
  assert hash(t) == hash(Target.parse("cpu"))


def test_check_interface_names_the_valid_ones():
  assert Target.parse("MOCK+AMD").check_interface().interface == "MOCK"
  assert Target.parse("AMD:1").check_interface(valid=(None,)).indices == (1,)
  with pytest.raises(RuntimeError, match=r"FAKE\+AMD: unknown interface 'FAKE' for AMD; valid: none \(the real "
                                         r"driver\), MOCK"):
    Target.parse("FAKE+AMD").check_interface()
  with pytest.raises(RuntimeError, match="valid: none"): Target.parse("MOCK+NV").check_interface(valid=(None,))
