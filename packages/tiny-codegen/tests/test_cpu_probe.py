"""`tiny_codegen.cpu_probe`: instruction set extensions are trusted only when a child process ran them; a SIGILL ends
the child, never the caller. And `Machine.isa`: the cpuinfo flags the probes start from."""
from __future__ import annotations

import platform
import signal

import pytest

from tiny_codegen import cpu_probe
from tiny_codegen.machine import Machine

x86_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 machine code")


def test_isa_flags_from_cpuinfo(tmp_path) -> None:
  from test_machine import fake_tree
  spr = ("flags\t\t: fpu avx avx2 fma f16c avx512f avx512vl avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_tile "
         "amx_int8 avx512_fp16\n")
  m = Machine.from_sysfs(fake_tree(str(tmp_path / "spr"), spr, []))
  assert m.isa == frozenset({"f16c", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx512vl",
                             "avx512_vnni", "avx_vnni"})
  zen3 = Machine.from_sysfs(fake_tree(str(tmp_path / "zen3"), "flags\t\t: fpu avx avx2 fma\n", []))
  assert zen3.isa == frozenset()
  arm = Machine.from_sysfs(fake_tree(str(tmp_path / "arm"), "Features\t: fp asimd bf16\n", []))
  assert arm.isa == frozenset()


def test_unknown_feature_is_a_clear_error() -> None:
  valid = r"valid: \['amx_bf16', 'avx512_bf16', 'avx512_vnni', 'avx_vnni'\]"
  with pytest.raises(ValueError, match=r"unknown feature 'avx9'.*" + valid):
    cpu_probe.executes("avx9")


def test_no_flag_no_child(monkeypatch) -> None:
  """Without the cpuinfo flag the answer is False and no child starts."""
  def boom(feature: str) -> int: raise AssertionError(f"a child ran for {feature}")
  monkeypatch.setattr(cpu_probe, "probe", boom)
  assert not cpu_probe.executes("avx512_bf16", flags=frozenset({"f16c"}))
  assert not cpu_probe.executes("amx_bf16", flags=frozenset({"amx_tile"}))  # amx_bf16 missing


@x86_only
def test_sigill_stays_in_the_child(monkeypatch) -> None:
  """An instruction the CPU refuses (ud2: SIGILL everywhere) is reported as not executing; this process lives."""
  monkeypatch.setitem(cpu_probe.PROBES, "ud2", ((), cpu_probe._PRELUDE + "run(bytes([0x0f, 0x0b, 0xc3]))\n"))
  cpu_probe.probe.cache_clear()
  try:
    assert cpu_probe.probe("ud2") == -signal.SIGILL
    assert not cpu_probe.executes("ud2", flags=frozenset())
  finally:
    cpu_probe.probe.cache_clear()


@x86_only
def test_a_plain_return_executes(monkeypatch) -> None:
  """The harness itself: code that only returns runs (so a False above is the instruction's, not the harness's)."""
  monkeypatch.setitem(cpu_probe.PROBES, "ret", ((), cpu_probe._PRELUDE + "run(bytes([0x31, 0xc0, 0xc3]))\n"))
  cpu_probe.probe.cache_clear()
  try: assert cpu_probe.executes("ret", flags=frozenset())
  finally: cpu_probe.probe.cache_clear()


def test_probe_off_by_environment(monkeypatch) -> None:
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  assert not cpu_probe.executes("avx512_bf16", flags=frozenset({"avx512_bf16"}))


@x86_only
def test_host_answer_follows_flags_and_child() -> None:
  """On this host: a feature whose flags are missing never executes; one listed executes exactly when its child
  exited 0 (on the 2-vCPU Xeon 6/207 VM both avx512_bf16 and, after arch_prctl, AMX-BF16 do)."""
  from tiny_codegen.machine import host_machine
  isa = host_machine().isa
  for feature, (flags, _) in cpu_probe.PROBES.items():
    want = all(f in isa for f in flags) and cpu_probe.probe(feature) == 0
    assert cpu_probe.executes(feature) == want, (feature, isa, cpu_probe.probe(feature))
