"""A CDNA3 (gfx942, MI300) instruction emulator: the GFX9 encodings decoded, executed on 64-lane waves.

Encodings and opcode numbers are those of AMD's "AMD Instinct MI300 (CDNA3) Instruction Set Architecture" reference
guide (chapter "Microcode Formats"); tests compare every opcode/name pair below with AMD's machine-readable ISA tables
(the CDNA ISA XML transcribed in tinygrad 0.14.0's wheel, `autogen/amd/cdna/enum.py`, a test-only oracle) and the
decoder with LLVM's own listing of every kernel the renderer emits for gfx942 (tests/test_cdna3.py).

How it runs: `decode9` turns GFX9 bits into the RDNA3 emulator's `Inst`. Where a GFX9 instruction means exactly what
an RDNA3 one does (most scalar ops, 32/64-bit VALU, loads/stores, LDS, atomics), the `Inst` carries the RDNA3 format
and opcode and `rdna3.Emulator`'s handlers run it, on `Wave64` (64-lane VGPR columns, 64-bit EXEC/VCC). What GFX9 does
differently has handlers here (formats named G9*): the 64-bit saveexec ops; VOPC (V_CMPX writes EXEC *and* the SGPR
destination before GFX10); 16-bit VALU ops, which on GFX9 zero the high half of the destination (the newer op_sel
VOP3 ones write the half op_sel[3] picks and keep the other); SDWA (sub-dword operand/result selection); the packed
float32 ops (v_pk_fma/mul/add_f32, v_pk_mov_b32), v_mov_b64, v_lshl_add_u64, v_mbcnt_*; s_setreg/s_getreg of the MODE
register; and MFMA (`v_mfma_f32_16x16x16_{f16,bf16}`, exact products summed exactly and rounded once to float32, as
the WMMA emulation does). Operand code 124 is M0 on GFX9 (NULL on GFX11): the decoder renumbers it to the RDNA3 M0.
An encoding or opcode this emulator does not run raises `UnsupportedInstruction` with its name and address.
"""
from __future__ import annotations

import math
import operator
import struct
from typing import Any, Callable

from tiny_runtime_amd.emu import rdna3 as r3
from tiny_runtime_amd.emu.isa import VOP3_EXTRA, _popcount
from tiny_runtime_amd.emu.rdna3 import (INLINE_F32, LITERAL, MASK32, MASK64, NULL, SCC_SRC, VCC_LO, VOP3_16, Emulator,
                                        Inst, UnsupportedInstruction, Wave, _bf16, _f16, _f16_bits, bits32,
                                        f32, sext, vec_f16, vec_f32, vopc_compare)

M0_GFX9, M0_RDNA3 = 124, 125
SDWA, DPP = 249, 250


def _names(spec: str) -> dict[int, str]:
  """'0:s_mov_b32 1:s_mov_b64 ...' -> {0: 's_mov_b32', ...} (the opcode tables below, as the ISA guide lists them)."""
  return {int(k): v for k, v in (t.split(":") for t in spec.split())}


# ***** GFX9/CDNA3 opcodes (ISA guide "Instructions"; checked against AMD's ISA XML in the tests) *****
SOP1_9 = _names("0:s_mov_b32 1:s_mov_b64 2:s_cmov_b32 3:s_cmov_b64 4:s_not_b32 5:s_not_b64 8:s_brev_b32 "
                "10:s_bcnt0_i32_b32 12:s_bcnt1_i32_b32 13:s_bcnt1_i32_b64 16:s_ff1_i32_b32 17:s_ff1_i32_b64 "
                "18:s_flbit_i32_b32 22:s_sext_i32_i8 23:s_sext_i32_i16 24:s_bitset0_b32 26:s_bitset1_b32 "
                "28:s_getpc_b64 29:s_setpc_b64 30:s_swappc_b64 32:s_and_saveexec_b64 33:s_or_saveexec_b64 "
                "34:s_xor_saveexec_b64 35:s_andn2_saveexec_b64 36:s_orn2_saveexec_b64 37:s_nand_saveexec_b64 "
                "38:s_nor_saveexec_b64 39:s_xnor_saveexec_b64 48:s_abs_i32 51:s_andn1_saveexec_b64 "
                "52:s_orn1_saveexec_b64")
SOP2_9 = _names("0:s_add_u32 1:s_sub_u32 2:s_add_i32 3:s_sub_i32 4:s_addc_u32 5:s_subb_u32 6:s_min_i32 "
                "7:s_min_u32 8:s_max_i32 9:s_max_u32 10:s_cselect_b32 11:s_cselect_b64 12:s_and_b32 13:s_and_b64 "
                "14:s_or_b32 15:s_or_b64 16:s_xor_b32 17:s_xor_b64 18:s_andn2_b32 19:s_andn2_b64 20:s_orn2_b32 "
                "21:s_orn2_b64 22:s_nand_b32 23:s_nand_b64 24:s_nor_b32 25:s_nor_b64 26:s_xnor_b32 27:s_xnor_b64 "
                "28:s_lshl_b32 29:s_lshl_b64 30:s_lshr_b32 31:s_lshr_b64 32:s_ashr_i32 33:s_ashr_i64 "
                "34:s_bfm_b32 36:s_mul_i32 37:s_bfe_u32 38:s_bfe_i32 39:s_bfe_u64 40:s_bfe_i64 42:s_absdiff_i32 "
                "44:s_mul_hi_u32 45:s_mul_hi_i32 46:s_lshl1_add_u32 47:s_lshl2_add_u32 48:s_lshl3_add_u32 "
                "49:s_lshl4_add_u32 50:s_pack_ll_b32_b16 51:s_pack_lh_b32_b16 52:s_pack_hh_b32_b16")
SOPK_9 = _names("0:s_movk_i32 1:s_cmovk_i32 2:s_cmpk_eq_i32 3:s_cmpk_lg_i32 4:s_cmpk_gt_i32 5:s_cmpk_ge_i32 "
                "6:s_cmpk_lt_i32 7:s_cmpk_le_i32 8:s_cmpk_eq_u32 9:s_cmpk_lg_u32 10:s_cmpk_gt_u32 11:s_cmpk_ge_u32 "
                "12:s_cmpk_lt_u32 13:s_cmpk_le_u32 14:s_addk_i32 15:s_mulk_i32 17:s_getreg_b32 18:s_setreg_b32 "
                "20:s_setreg_imm32_b32")
SOPC_9 = _names("0:s_cmp_eq_i32 1:s_cmp_lg_i32 2:s_cmp_gt_i32 3:s_cmp_ge_i32 4:s_cmp_lt_i32 5:s_cmp_le_i32 "
                "6:s_cmp_eq_u32 7:s_cmp_lg_u32 8:s_cmp_gt_u32 9:s_cmp_ge_u32 10:s_cmp_lt_u32 11:s_cmp_le_u32 "
                "12:s_bitcmp0_b32 13:s_bitcmp1_b32 14:s_bitcmp0_b64 15:s_bitcmp1_b64 18:s_cmp_eq_u64 19:s_cmp_lg_u64")
SOPP_9 = _names("0:s_nop 1:s_endpgm 2:s_branch 4:s_cbranch_scc0 5:s_cbranch_scc1 6:s_cbranch_vccz 7:s_cbranch_vccnz "
                "8:s_cbranch_execz 9:s_cbranch_execnz 10:s_barrier 12:s_waitcnt 14:s_sleep 15:s_setprio 16:s_sendmsg")
SMEM_9 = _names("0:s_load_dword 1:s_load_dwordx2 2:s_load_dwordx4 3:s_load_dwordx8 4:s_load_dwordx16 "
                "32:s_dcache_inv 33:s_dcache_wb")
VOP1_9 = _names("0:v_nop 1:v_mov_b32 2:v_readfirstlane_b32 3:v_cvt_i32_f64 4:v_cvt_f64_i32 5:v_cvt_f32_i32 "
                "6:v_cvt_f32_u32 7:v_cvt_u32_f32 8:v_cvt_i32_f32 10:v_cvt_f16_f32 11:v_cvt_f32_f16 "
                "12:v_cvt_rpi_i32_f32 13:v_cvt_flr_i32_f32 15:v_cvt_f32_f64 16:v_cvt_f64_f32 17:v_cvt_f32_ubyte0 "
                "18:v_cvt_f32_ubyte1 19:v_cvt_f32_ubyte2 20:v_cvt_f32_ubyte3 21:v_cvt_u32_f64 22:v_cvt_f64_u32 "
                "23:v_trunc_f64 24:v_ceil_f64 25:v_rndne_f64 26:v_floor_f64 27:v_fract_f32 28:v_trunc_f32 "
                "29:v_ceil_f32 30:v_rndne_f32 31:v_floor_f32 32:v_exp_f32 33:v_log_f32 34:v_rcp_f32 "
                "35:v_rcp_iflag_f32 36:v_rsq_f32 37:v_rcp_f64 38:v_rsq_f64 39:v_sqrt_f32 40:v_sqrt_f64 41:v_sin_f32 "
                "42:v_cos_f32 43:v_not_b32 44:v_bfrev_b32 45:v_ffbh_u32 46:v_ffbl_b32 47:v_ffbh_i32 "
                "48:v_frexp_exp_i32_f64 "
                "49:v_frexp_mant_f64 50:v_fract_f64 51:v_frexp_exp_i32_f32 52:v_frexp_mant_f32 56:v_mov_b64 "
                "57:v_cvt_f16_u16 58:v_cvt_f16_i16 59:v_cvt_u16_f16 60:v_cvt_i16_f16 61:v_rcp_f16 62:v_sqrt_f16 "
                "63:v_rsq_f16 64:v_log_f16 65:v_exp_f16 68:v_floor_f16 69:v_ceil_f16 70:v_trunc_f16 71:v_rndne_f16 "
                "73:v_sin_f16 74:v_cos_f16 82:v_accvgpr_mov_b32")
VOP2_9 = _names("0:v_cndmask_b32 1:v_add_f32 2:v_sub_f32 3:v_subrev_f32 4:v_fmac_f64 5:v_mul_f32 6:v_mul_i32_i24 "
                "7:v_mul_hi_i32_i24 8:v_mul_u32_u24 9:v_mul_hi_u32_u24 10:v_min_f32 11:v_max_f32 12:v_min_i32 "
                "13:v_max_i32 14:v_min_u32 15:v_max_u32 16:v_lshrrev_b32 17:v_ashrrev_i32 18:v_lshlrev_b32 "
                "19:v_and_b32 20:v_or_b32 21:v_xor_b32 23:v_fmamk_f32 24:v_fmaak_f32 25:v_add_co_u32 "
                "26:v_sub_co_u32 27:v_subrev_co_u32 28:v_addc_co_u32 29:v_subb_co_u32 30:v_subbrev_co_u32 "
                "31:v_add_f16 32:v_sub_f16 33:v_subrev_f16 34:v_mul_f16 38:v_add_u16 39:v_sub_u16 40:v_subrev_u16 "
                "41:v_mul_lo_u16 42:v_lshlrev_b16 43:v_lshrrev_b16 44:v_ashrrev_i16 45:v_max_f16 46:v_min_f16 "
                "47:v_max_u16 48:v_max_i16 49:v_min_u16 50:v_min_i16 51:v_ldexp_f16 52:v_add_u32 53:v_sub_u32 "
                "54:v_subrev_u32 59:v_fmac_f32")
VOP3_9 = _names("450:v_mad_i32_i24 451:v_mad_u32_u24 456:v_bfe_u32 457:v_bfe_i32 458:v_bfi_b32 459:v_fma_f32 "
                "460:v_fma_f64 462:v_alignbit_b32 463:v_alignbyte_b32 464:v_min3_f32 465:v_min3_i32 466:v_min3_u32 "
                "467:v_max3_f32 468:v_max3_i32 469:v_max3_u32 470:v_med3_f32 471:v_med3_i32 472:v_med3_u32 "
                "478:v_div_fixup_f32 479:v_div_fixup_f64 482:v_div_fmas_f32 483:v_div_fmas_f64 491:v_mad_legacy_u16 "
                "492:v_mad_legacy_i16 493:v_perm_b32 494:v_fma_legacy_f16 495:v_div_fixup_legacy_f16 "
                "499:v_xad_u32 500:v_min3_f16 501:v_min3_i16 502:v_min3_u16 503:v_max3_f16 504:v_max3_i16 "
                "505:v_max3_u16 506:v_med3_f16 507:v_med3_i16 508:v_med3_u16 509:v_lshl_add_u32 510:v_add_lshl_u32 "
                "511:v_add3_u32 512:v_lshl_or_b32 513:v_and_or_b32 514:v_or3_b32 516:v_mad_u16 517:v_mad_i16 "
                "518:v_fma_f16 519:v_div_fixup_f16 520:v_lshl_add_u64 640:v_add_f64 641:v_mul_f64 642:v_min_f64 "
                "643:v_max_f64 644:v_ldexp_f64 645:v_mul_lo_u32 646:v_mul_hi_u32 647:v_mul_hi_i32 648:v_ldexp_f32 "
                "649:v_readlane_b32 650:v_writelane_b32 651:v_bcnt_u32_b32 652:v_mbcnt_lo_u32_b32 "
                "653:v_mbcnt_hi_u32_b32 655:v_lshlrev_b64 656:v_lshrrev_b64 657:v_ashrrev_i64 659:v_bfm_b32 "
                "662:v_cvt_pkrtz_f16_f32 668:v_add_i32 669:v_sub_i32 672:v_pack_b32_f16 673:v_mul_legacy_f32")
VOP3SD_9 = _names("281:v_add_co_u32 282:v_sub_co_u32 283:v_subrev_co_u32 284:v_addc_co_u32 285:v_subb_co_u32 "
                  "286:v_subbrev_co_u32 480:v_div_scale_f32 481:v_div_scale_f64 488:v_mad_u64_u32")
VOP3P_9 = _names("0:v_pk_mad_i16 1:v_pk_mul_lo_u16 2:v_pk_add_i16 3:v_pk_sub_i16 4:v_pk_lshlrev_b16 "
                 "5:v_pk_lshrrev_b16 6:v_pk_ashrrev_i16 7:v_pk_max_i16 8:v_pk_min_i16 9:v_pk_mad_u16 10:v_pk_add_u16 "
                 "11:v_pk_sub_u16 12:v_pk_max_u16 13:v_pk_min_u16 14:v_pk_fma_f16 15:v_pk_add_f16 16:v_pk_mul_f16 "
                 "17:v_pk_min_f16 18:v_pk_max_f16 26:v_dot2_f32_bf16 32:v_fma_mix_f32 33:v_fma_mixlo_f16 "
                 "34:v_fma_mixhi_f16 35:v_dot2_f32_f16 48:v_pk_fma_f32 49:v_pk_mul_f32 50:v_pk_add_f32 "
                 "51:v_pk_mov_b32 77:v_mfma_f32_16x16x16_f16 88:v_accvgpr_read_b32 89:v_accvgpr_write_b32 "
                 "97:v_mfma_f32_16x16x16_bf16")
DS_9 = _names("0:ds_add_u32 1:ds_sub_u32 2:ds_rsub_u32 3:ds_inc_u32 4:ds_dec_u32 5:ds_min_i32 6:ds_max_i32 "
              "7:ds_min_u32 8:ds_max_u32 9:ds_and_b32 10:ds_or_b32 11:ds_xor_b32 13:ds_write_b32 14:ds_write2_b32 "
              "15:ds_write2st64_b32 16:ds_cmpst_b32 18:ds_min_f32 19:ds_max_f32 21:ds_add_f32 30:ds_write_b8 "
              "31:ds_write_b16 32:ds_add_rtn_u32 33:ds_sub_rtn_u32 34:ds_rsub_rtn_u32 35:ds_inc_rtn_u32 "
              "36:ds_dec_rtn_u32 37:ds_min_rtn_i32 38:ds_max_rtn_i32 39:ds_min_rtn_u32 40:ds_max_rtn_u32 "
              "41:ds_and_rtn_b32 42:ds_or_rtn_b32 43:ds_xor_rtn_b32 45:ds_wrxchg_rtn_b32 48:ds_cmpst_rtn_b32 "
              "50:ds_min_rtn_f32 51:ds_max_rtn_f32 53:ds_add_rtn_f32 54:ds_read_b32 55:ds_read2_b32 "
              "56:ds_read2st64_b32 57:ds_read_i8 58:ds_read_u8 59:ds_read_i16 60:ds_read_u16 61:ds_swizzle_b32 "
              "62:ds_permute_b32 63:ds_bpermute_b32 77:ds_write_b64 78:ds_write2_b64 79:ds_write2st64_b64 "
              "84:ds_write_b8_d16_hi 85:ds_write_b16_d16_hi 86:ds_read_u8_d16 87:ds_read_u8_d16_hi "
              "88:ds_read_i8_d16 89:ds_read_i8_d16_hi 90:ds_read_u16_d16 91:ds_read_u16_d16_hi 118:ds_read_b64 "
              "119:ds_read2_b64 120:ds_read2st64_b64 222:ds_write_b96 223:ds_write_b128 254:ds_read_b96 "
              "255:ds_read_b128")
FLAT_9 = _names("16:load_ubyte 17:load_sbyte 18:load_ushort 19:load_sshort 20:load_dword 21:load_dwordx2 "
                "22:load_dwordx3 23:load_dwordx4 24:store_byte 25:store_byte_d16_hi 26:store_short "
                "27:store_short_d16_hi 28:store_dword 29:store_dwordx2 30:store_dwordx3 31:store_dwordx4 "
                "32:load_ubyte_d16 33:load_ubyte_d16_hi 34:load_sbyte_d16 35:load_sbyte_d16_hi 36:load_short_d16 "
                "37:load_short_d16_hi 64:atomic_swap 65:atomic_cmpswap 66:atomic_add 67:atomic_sub 68:atomic_smin "
                "69:atomic_umin 70:atomic_smax 71:atomic_umax 72:atomic_and 73:atomic_or 74:atomic_xor "
                "75:atomic_inc 76:atomic_dec 77:atomic_add_f32 96:atomic_swap_x2 97:atomic_cmpswap_x2 "
                "98:atomic_add_x2 99:atomic_sub_x2 100:atomic_smin_x2 101:atomic_umin_x2 102:atomic_smax_x2 "
                "103:atomic_umax_x2 104:atomic_and_x2 105:atomic_or_x2 106:atomic_xor_x2 107:atomic_inc_x2 "
                "108:atomic_dec_x2")
MUBUF_9 = _names("40:buffer_wbl2 41:buffer_inv")
_CMP_F = ["f", "lt", "eq", "le", "gt", "lg", "ge", "o", "u", "nge", "nlg", "ngt", "nle", "neq", "nlt", "tru"]
_CMP_I = ["f", "lt", "eq", "le", "gt", "ne", "ge", "t"]


def _vopc9() -> dict[int, tuple[str, int]]:
  """VOPC opcode -> (name, the RDNA3 VOPC opcode with the same compare), for V_CMP and V_CMPX."""
  out: dict[int, tuple[str, int]] = {0x10: ("v_cmp_class_f32", 0x7E), 0x11: ("v_cmpx_class_f32", 0xFE),
                                     0x12: ("v_cmp_class_f64", 0x7F), 0x13: ("v_cmpx_class_f64", 0xFF),
                                     0x14: ("v_cmp_class_f16", 0x7D), 0x15: ("v_cmpx_class_f16", 0xFD)}
  for base, typ, rb in ((0x20, "f16", 0x00), (0x40, "f32", 0x10), (0x60, "f64", 0x20)):
    for i, c in enumerate(_CMP_F):
      out[base + i], out[base + 0x10 + i] = (f"v_cmp_{c}_{typ}", rb + i), (f"v_cmpx_{c}_{typ}", 0x80 + rb + i)
  for base, rb, bits in ((0xA0, 0x30, 16), (0xC0, 0x40, 32), (0xE0, 0x50, 64)):
    for j, sign in enumerate("iu"):
      for i, c in enumerate(_CMP_I):
        out[base + 8 * j + i] = (f"v_cmp_{c}_{sign}{bits}", rb + 8 * j + i)
        out[base + 0x10 + 8 * j + i] = (f"v_cmpx_{c}_{sign}{bits}", 0x80 + rb + 8 * j + i)
  return out


VOPC_9 = _vopc9()

# ***** GFX9 -> RDNA3 opcodes for the instructions that mean the same (RDNA3 ISA names, where GFX11 renamed them) *****
_SOP1_R3 = {0: 0, 1: 1, 2: 2, 4: 30, 8: 4, 10: 22, 12: 24, 13: 25, 16: 8, 17: 9, 18: 10, 22: 14, 23: 15, 24: 16,
            26: 18, 28: 71, 29: 72, 30: 73, 48: 21}
_SOP2_R3 = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 18, 7: 19, 8: 20, 9: 21, 10: 48, 11: 49, 12: 22, 13: 23, 14: 24,
            15: 25, 16: 26, 17: 27, 18: 34, 19: 35, 20: 36, 21: 37, 22: 28, 23: 29, 24: 30, 25: 31, 26: 32, 27: 33,
            28: 8, 29: 9, 30: 10, 31: 11, 32: 12, 33: 13, 34: 42, 36: 44, 37: 38, 38: 39, 39: 40, 40: 41, 42: 6,
            44: 45, 45: 46, 46: 14, 47: 15, 48: 16, 49: 17, 50: 50, 51: 51, 52: 52}
_SOPK_R3 = {0: 0, 1: 2, **{2 + i: 3 + i for i in range(12)}, 14: 15, 15: 16}
_SOPC_R3 = {**{i: i for i in range(16)}, 18: 16, 19: 17}
_SOPP_R3 = {0: 0, 1: 48, 2: 32, 4: 33, 5: 34, 6: 35, 7: 36, 8: 37, 9: 38, 10: 61, 12: 9, 14: 3, 15: 53, 16: 54}
_VOP1_R3 = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 12: 12, 13: 13, 15: 15, 16: 16, 17: 17, 18: 18, 19: 19,
            20: 20, 21: 21, 22: 22, 23: 23, 24: 24, 25: 25, 26: 26, 27: 32, 28: 33, 29: 34, 30: 35, 31: 36, 32: 37,
            33: 39, 34: 42, 35: 43, 36: 46, 37: 47, 38: 49, 39: 51, 40: 52, 41: 53, 42: 54, 43: 55, 44: 56, 45: 57,
            46: 58, 47: 59, 48: 60, 49: 61, 50: 62, 51: 63, 52: 64}
_VOP2_R3 = {0: 1, 1: 3, 2: 4, 3: 5, 5: 8, 6: 9, 7: 10, 8: 11, 9: 12, 10: 15, 11: 16, 12: 17, 13: 18, 14: 19, 15: 20,
            16: 25, 17: 26, 18: 24, 19: 27, 20: 28, 21: 29, 23: 44, 24: 45, 28: 32, 29: 33, 30: 34, 52: 37, 53: 38,
            54: 39, 59: 43}
_VOP3_R3 = {450: 0x20A, 451: 0x20B, 456: 0x210, 457: 0x211, 458: 0x212, 459: 0x213, 460: 0x214, 462: 0x216,
            464: 0x219, 465: 0x21A, 466: 0x21B, 467: 0x21C, 468: 0x21D, 469: 0x21E, 471: 0x220, 472: 0x221,
            478: 0x227, 479: 0x228, 482: 0x237, 483: 0x238, 499: 0x245, 509: 0x246, 510: 0x247, 511: 0x255,
            512: 0x256, 513: 0x257, 514: 0x258, 640: 0x327, 641: 0x328, 642: 0x329, 643: 0x32A, 644: 0x32B,
            645: 0x32C, 646: 0x32D, 647: 0x32E, 648: 0x31C, 649: 0x360, 650: 0x361, 655: 0x33C, 656: 0x33D,
            657: 0x33E, 662: 0x12F, 672: 0x311, 673: 0x107, 281: 0x300, 282: 0x301, 284: 0x120, 285: 0x121,
            286: 0x122, 480: 0x2FC, 481: 0x2FD, 488: 0x2FE}
_VOP3P_R3 = {**{i: i for i in range(19)}, 26: 26, 32: 32, 33: 33, 34: 34, 35: 19}
_DS_R3 = {**{op: op for op in DS_9}, 53: 121, 61: 53, 62: 178, 63: 179, **{84 + i: 160 + i for i in range(8)}}
_FLAT_R3 = {**{op: op for op in range(16, 24)}, 24: 24, 25: 36, 26: 25, 27: 37, 28: 26, 29: 27, 30: 28, 31: 29,
            32: 30, 33: 33, 34: 31, 35: 34, 36: 32, 37: 35, 64: 51, 65: 52, 66: 53, 67: 54, 68: 56, 69: 57, 70: 58,
            71: 59, 72: 60, 73: 61, 74: 62, 75: 63, 76: 64, 77: 86, **{96 + i: 65 + i for i in range(13)}}

# 16-bit VALU ops: name -> (sources, is float, fn on 16-bit patterns, zeroes the high half); fns from the RDNA3 tables
_R3_16 = {v[0]: v for v in VOP3_16.values()}
_RENAME_16 = {"v_add_u16": "v_add_nc_u16", "v_sub_u16": "v_sub_nc_u16", "v_mad_legacy_u16": "v_mad_u16",
              "v_mad_legacy_i16": "v_mad_i16", "v_fma_legacy_f16": "v_fma_f16",
              "v_div_fixup_legacy_f16": "v_div_fixup_f16"}  # GFX9's "legacy" forms zero the high half


def _op16(name: str, legacy: bool) -> tuple[int, bool, Callable[..., int], bool]:
  if name == "v_subrev_u16": return 2, False, lambda a, b: (b - a) & 0xFFFF, legacy
  _, n, fp, fn = _R3_16[_RENAME_16.get(name, name)]
  return n, fp, fn, legacy


OPS16: dict[str, tuple[int, bool, Callable[..., int], bool]] = {
  **{n: _op16(n, True) for n in (*(VOP2_9[o] for o in range(31, 52) if o in VOP2_9 and o not in (35, 36, 37)),
                                 *(VOP1_9[o] for o in range(57, 75) if o in VOP1_9))},
  **{VOP3_9[o]: _op16(VOP3_9[o], False) for o in (*range(500, 509), 516, 517, 518, 519)},
  **{VOP3_9[o]: _op16(VOP3_9[o], True) for o in (491, 492, 494, 495)}}

MFMA = {77: _f16, 97: _bf16}  # v_mfma_f32_16x16x16_{f16,bf16}: input element -> float
HW_REG_MODE = 1


def _w(code: bytes | memoryview, pc: int, i: int) -> int:
  return struct.unpack_from("<I", code, pc + 4 * i)[0] if pc + 4 * i + 4 <= len(code) else 0


def _sc(c: int) -> int: return M0_RDNA3 if c == M0_GFX9 else c  # a scalar operand code: GFX9 M0 -> RDNA3's


def decode9(code: bytes | memoryview, pc: int = 0) -> Inst:
  """Decode the GFX9 (CDNA3) instruction at byte offset `pc` of `code` (see the module docstring)."""
  w0, w1 = _w(code, pc, 0), _w(code, pc, 1)
  b = r3._bits

  def lit(inst: Inst, *srcs: int) -> Inst:
    if LITERAL in srcs:
      inst.literal = _w(code, pc, inst.size // 4)
      inst.size += 4
    return inst

  top9, top6 = w0 >> 23, w0 >> 26
  if top9 == 0b101111101:  # SOP1
    op, d, s = b(w0, 8, 8), _sc(b(w0, 16, 7)), _sc(w0 & 0xFF)
    name = SOP1_9.get(op, f"sop1_{op}")
    fmt, rop = ("SOP1", _SOP1_R3[op]) if op in _SOP1_R3 else ("G9SOP1", op)
    return lit(Inst(fmt, rop, {"sdst": d, "ssrc0": s}, 4, name), s)
  if top9 == 0b101111110:  # SOPC
    op, s0, s1 = b(w0, 16, 7), _sc(w0 & 0xFF), _sc(b(w0, 8, 8))
    return lit(Inst("SOPC", _SOPC_R3.get(op, 99), {"ssrc0": s0, "ssrc1": s1}, 4, SOPC_9.get(op, f"sopc_{op}")), s0, s1)
  if top9 == 0b101111111:  # SOPP
    op = b(w0, 16, 7)
    return Inst("SOPP", _SOPP_R3.get(op, 0x7F), {"simm16": w0 & 0xFFFF}, 4, SOPP_9.get(op, f"sopp_{op}"))
  if w0 >> 28 == 0b1011:  # SOPK
    op, d = b(w0, 23, 5), _sc(b(w0, 16, 7))
    if op in (17, 18, 20):
      inst = Inst("G9SOPK", op, {"sdst": d, "simm16": w0 & 0xFFFF}, 4, SOPK_9[op])
      return lit(inst, LITERAL) if op == 20 else inst
    return Inst("SOPK", _SOPK_R3.get(op, 31), {"sdst": d, "simm16": w0 & 0xFFFF}, 4, SOPK_9.get(op, f"sopk_{op}"))
  if w0 >> 30 == 0b10:  # SOP2
    op, d, s0, s1 = b(w0, 23, 7), _sc(b(w0, 16, 7)), _sc(w0 & 0xFF), _sc(b(w0, 8, 8))
    inst = Inst("SOP2", _SOP2_R3.get(op, 127), {"sdst": d, "ssrc0": s0, "ssrc1": s1}, 4, SOP2_9.get(op, f"sop2_{op}"))
    return lit(inst, s0, s1)
  if top6 == 0b110000:  # SMEM: IMM (bit 17) -> a signed 21-bit byte offset; SOE (bit 14) -> SGPR offset in dword 1
    op, imm, soe = b(w0, 18, 8), b(w0, 17, 1), b(w0, 14, 1)
    off = sext(w1 & 0x1FFFFF, 21) if imm else 0
    soff = _sc(w1 >> 25) if soe else NULL if imm else _sc(w1 & 0x7F)
    f = {"sbase": (w0 & 0x3F) * 2, "sdata": _sc(b(w0, 6, 7)), "offset": off, "soffset": soff}
    if op in (32, 33): return Inst("G9NOP", op, f, 8, SMEM_9[op])
    return Inst("SMEM", op if op <= 4 else 99, f, 8, SMEM_9.get(op, f"smem_{op}"))
  if top6 == 0b110110:  # DS
    op = b(w0, 17, 8)
    f = {"offset0": w0 & 0xFF, "offset1": b(w0, 8, 8), "addr": w1 & 0xFF, "data0": b(w1, 8, 8),
         "data1": b(w1, 16, 8), "vdst": w1 >> 24}
    name = DS_9.get(op, f"ds_op{op}")
    if b(w0, 25, 1) or b(w0, 16, 1): return Inst("G9BAD", op, {"why": 1}, 8, name + " (acc/gds)")
    return Inst("DS", _DS_R3.get(op, 0x1FF), f, 8, name)
  if top6 == 0b111000:  # MUBUF: only the cache write-back/invalidate (memory model fences) run, as no-ops
    op = b(w0, 18, 7)
    return Inst("G9NOP" if op in MUBUF_9 else "G9BAD", op, {}, 8, MUBUF_9.get(op, f"buffer_op{op}"))
  if top6 == 0b110111:  # FLAT / SCRATCH / GLOBAL (gfx940: SC0 bit 16, NT 17, SC1 25; ACC w1 bit 23; SVE bit 13)
    op, seg = b(w0, 18, 7), b(w0, 14, 2)
    saddr = b(w1, 16, 7)
    f = {"offset": (w0 & 0xFFF) if seg == 0 else sext(w0 & 0x1FFF, 13), "seg": seg, "addr": w1 & 0xFF,
         "data": b(w1, 8, 8), "saddr": NULL if saddr == 0x7F else _sc(saddr), "sve": b(w0, 13, 1),
         "vdst": w1 >> 24, "glc": b(w0, 16, 1)}
    name = f"{['flat', 'scratch', 'global', 'seg3'][seg]}_{FLAT_9.get(op, f'op{op}')}"
    if b(w1, 23, 1): return Inst("G9BAD", op, {}, 8, name + " (acc)")
    return Inst("FLAT", _FLAT_R3.get(op, 0x7F), f, 8, name)
  if top9 == 0b110100111:  # VOP3P, and VOP3P-MAI (MFMA)
    op = b(w0, 16, 7)
    f = {"vdst": w0 & 0xFF, "neg_hi": b(w0, 8, 3), "opsel": b(w0, 11, 3),
         "opsel_hi": b(w1, 27, 2) | (b(w0, 14, 1) << 2), "clamp": b(w0, 15, 1), "src0": _sc(w1 & 0x1FF),
         "src1": _sc(b(w1, 9, 9)), "src2": _sc(b(w1, 18, 9)), "neg": w1 >> 29}
    name = VOP3P_9.get(op, f"vop3p_{op}")
    if op in MFMA:
      f = {"vdst": w0 & 0xFF, "cbsz": b(w0, 8, 3), "abid": b(w0, 11, 4), "acc_cd": b(w0, 15, 1), "src0": w1 & 0x1FF,
           "src1": b(w1, 9, 9), "src2": _sc(b(w1, 18, 9)), "acc": b(w1, 27, 2), "blgp": w1 >> 29}
      return Inst("G9MFMA", op, f, 8, name)
    if op in _VOP3P_R3: return lit(Inst("VOP3P", _VOP3P_R3[op], f, 8, name), f["src0"], f["src1"], f["src2"])
    return Inst("G9VOP3P", op, f, 8, name)
  if top6 == 0b110100:  # VOP3 (VOP3SD: bits 14:8 are the carry/VCC-style SGPR destination)
    op = b(w0, 16, 10)
    f = {"vdst": w0 & 0xFF, "sdst": _sc(b(w0, 8, 7)), "abs": b(w0, 8, 3), "opsel": b(w0, 11, 4),
         "clamp": b(w0, 15, 1), "src0": _sc(w1 & 0x1FF), "src1": _sc(b(w1, 9, 9)), "src2": _sc(b(w1, 18, 9)),
         "omod": b(w1, 27, 2), "neg": w1 >> 29}
    if op < 256:
      name, rop = VOPC_9.get(op, (f"vopc_{op}", -1))
      return Inst("G9VOPC", rop, {**f, "sdst": _sc(f["vdst"]), "e64": 1}, 8, name + "_e64")
    if op in VOP3SD_9:
      name = VOP3SD_9[op]
      if op == 283:  # v_subrev_co_u32: v_sub_co_u32 with the sources swapped
        f = {**f, "src0": f["src1"], "src1": f["src0"], "neg": ((f["neg"] & 1) << 1) | ((f["neg"] >> 1) & 1)}
      return Inst("VOP3", _VOP3_R3.get(op, 0x301), f, 8, name + ("_e64" if op < 448 else ""))
    if op < 320:
      name = VOP2_9.get(op - 256, f"vop2_{op - 256}")
      if op == 260: return Inst("VOP3", 0x214, {**f, "src2": 256 + f["vdst"]}, 8, name + "_e64")  # v_fmac_f64
      if name in OPS16: return Inst("G9V16", op, f, 8, name + "_e64")
      if op - 256 in _VOP2_R3 and op - 256 not in (23, 24, 28, 29, 30):  # fmamk/fmaak: VOP2 only
        return Inst("VOP3", 0x100 + _VOP2_R3[op - 256], f, 8, name + "_e64")
      return Inst("G9BAD", op, f, 8, name + "_e64")
    if op < 448:
      o = op - 320
      name = VOP1_9.get(o, f"vop1_{o}")
      if name in OPS16 or o in (10, 11): return Inst("G9V16", op, f, 8, name + "_e64")
      if o in _VOP1_R3: return Inst("VOP3", 0x180 + _VOP1_R3[o], f, 8, name + "_e64")
      if o == 56: return Inst("G9MOV64", op, f, 8, name + "_e64")
      return Inst("G9BAD", op, f, 8, name + "_e64")
    name = VOP3_9.get(op, f"vop3_{op}")
    if name in OPS16: return Inst("G9V16", op, f, 8, name)
    if op == 649: f["vdst"] = _sc(f["vdst"])  # v_readlane_b32 writes an SGPR
    if op in _VOP3_R3: return Inst("VOP3", _VOP3_R3[op], f, 8, name)
    if name in VOP3_EXTRA or op in (520, 652, 653): return Inst("G9VOP3", op, f, 8, name)
    return Inst("G9BAD", op, f, 8, name)
  if w0 >> 25 in (0b0111111, 0b0111110) or w0 >> 31 == 0:  # VOP1, VOPC, VOP2 (e32), maybe with SDWA/DPP
    kind = "VOP1" if w0 >> 25 == 0b0111111 else "VOPC" if w0 >> 25 == 0b0111110 else "VOP2"
    src0 = w0 & 0x1FF
    if kind == "VOP1":
      op = b(w0, 9, 8)
      name = VOP1_9.get(op, f"vop1_{op}")
      vdst = _sc(b(w0, 17, 8)) if op == 2 else b(w0, 17, 8)
      f = {"vdst": vdst, "src0": _sc(src0)}
    elif kind == "VOPC":
      op = b(w0, 17, 8)
      name, rop = VOPC_9.get(op, (f"vopc_{op}", -1))
      f = {"src0": _sc(src0), "vsrc1": b(w0, 9, 8)}
    else:
      op = b(w0, 25, 6)
      name = VOP2_9.get(op, f"vop2_{op}")
      f = {"vdst": b(w0, 17, 8), "src0": _sc(src0), "vsrc1": b(w0, 9, 8)}
    if src0 == DPP: return Inst("G9BAD", op, f, 8, name + "_dpp")
    if src0 == SDWA:
      inner = _e32(kind, op, name, {**f, "src0": 256})
      if inner.fmt in ("G9BAD", "G9MOV64", "G9NOP"): return Inst("G9BAD", op, f, 8, name + "_sdwa")
      return Inst("G9SDWA", op, {"sdwa": w1, "kind": {"VOP1": 1, "VOP2": 2, "VOPC": 3}[kind],
                                 "inner": inner,  # type: ignore[dict-item]  # SDWA keeps its decoded inner Inst
                                 "vsrc1": f.get("vsrc1", 0)}, 8, name + "_sdwa")
    inst = _e32(kind, op, name, f)
    return lit(inst, f["src0"], *([LITERAL] if kind == "VOP2" and op in (23, 24) else []))
  return Inst("G9BAD", -1, {}, 4, f"unknown encoding {w0:#010x}")


def _e32(kind: str, op: int, name: str, f: dict[str, int]) -> Inst:
  """The `Inst` an e32 VOP1/VOP2/VOPC runs as (its fields `f` already decoded)."""
  if kind == "VOPC":
    _, rop = VOPC_9.get(op, ("", -1))
    return Inst("G9VOPC", rop, {"src0": f["src0"], "src1": 256 + f["vsrc1"], "sdst": VCC_LO, "abs": 0, "neg": 0,
                                "opsel": 0, "clamp": 0, "omod": 0}, 4, name + "_e32")
  if name in OPS16 or (kind == "VOP1" and op in (10, 11)):
    return Inst("G9V16", op | (0x100 if kind == "VOP2" else 0x140), _vop3_of(f), 4, name + "_e32")
  if kind == "VOP1":
    if op in _VOP1_R3: return Inst("VOP1", _VOP1_R3[op], f, 4, name + "_e32")
    if op == 56: return Inst("G9MOV64", op, _vop3_of(f), 4, name + "_e32")
    if op == 0: return Inst("G9NOP", op, f, 4, name + "_e32")
    return Inst("G9BAD", op, f, 4, name + "_e32")
  if op == 4:  # v_fmac_f64: D = fma(S0, S1, D), the RDNA3 v_fma_f64 with D as the addend
    return Inst("VOP3", 0x214, {**_vop3_of(f), "src2": 256 + f["vdst"]}, 4, name + "_e32")
  if op in (25, 26, 27):  # v_add/sub/subrev_co_u32_e32: carry out to VCC
    g = _vop3_of(f)
    if op == 27: g["src0"], g["src1"] = g["src1"], g["src0"]
    return Inst("VOP3", 0x300 if op == 25 else 0x301, {**g, "sdst": VCC_LO}, 4, name + "_e32")
  if op in _VOP2_R3: return Inst("VOP2", _VOP2_R3[op], f, 4, name + "_e32")
  return Inst("G9BAD", op, f, 4, name + "_e32")


def _vop3_of(f: dict[str, int]) -> dict[str, int]:
  """VOP3-style fields of an e32 VOP1/VOP2 (no modifiers; src1 is the VGPR vsrc1)."""
  return {"vdst": f["vdst"], "src0": f["src0"], "src1": 256 + f.get("vsrc1", 0), "src2": 0, "abs": 0, "neg": 0,
          "opsel": 0, "clamp": 0, "omod": 0, "sdst": VCC_LO}


_SAVEEXEC64: dict[int, Callable[[int, int], int]] = {
  32: lambda s, e: s & e, 33: lambda s, e: s | e, 34: lambda s, e: s ^ e, 35: lambda s, e: s & ~e & MASK64,
  36: lambda s, e: (s | ~e) & MASK64, 37: lambda s, e: ~(s & e) & MASK64, 38: lambda s, e: ~(s | e) & MASK64,
  39: lambda s, e: ~(s ^ e) & MASK64, 51: lambda s, e: ~s & e & MASK64, 52: lambda s, e: (~s | e) & MASK64}


class CDNA3Emulator(Emulator):
  """Runs gfx942 waves (`Wave64`): GFX9 decoding (`decode9`) over the RDNA3 emulator's handlers, plus the GFX9-only
  behaviour (see the module docstring)."""
  decode = staticmethod(decode9)

  def sread64(self, w: Wave, code: int, inst: Inst) -> int:
    """A 64-bit scalar operand; a 32-bit literal there is zero-extended by some ops and sign-extended by others (LLVM
    only emits literals below 2**31 for them, where the two agree): any other literal raises."""
    if code == LITERAL and (inst.literal or 0) < 1 << 31: return inst.literal or 0
    return super().sread64(w, code, inst)

  def g9bad(self, w: Wave, inst: Inst) -> None:
    raise UnsupportedInstruction(f"{inst.name} (gfx942) is not emulated, at {w.pc:#x}")

  def g9nop(self, w: Wave, inst: Inst) -> None: pass  # cache write-back/invalidate: memory is coherent here

  def g9sop1(self, w: Wave, inst: Inst) -> None:
    op, d, s = inst.op, inst.f["sdst"], inst.f["ssrc0"]
    if op in _SAVEEXEC64:  # sdst = EXEC; EXEC = fn(src, EXEC); SCC = EXEC != 0
      old, src = w.exec, self.sread64(w, s, inst)
      w.exec = _SAVEEXEC64[op](src, old)
      self.wmask(w, d, old)
      w.scc = int(w.exec != 0)
    elif op == 5:  # s_not_b64
      v = ~self.sread64(w, s, inst) & MASK64
      self.wmask(w, d, v)
      w.scc = int(v != 0)
    elif op == 3:  # s_cmov_b64
      if w.scc: self.wmask(w, d, self.sread64(w, s, inst))
    else: self.g9bad(w, inst)

  def g9sopk(self, w: Wave, inst: Inst) -> None:
    """s_getreg_b32 / s_setreg_b32 / s_setreg_imm32_b32 of the MODE register's FP fields: the emulator always keeps
    denormals and rounds to nearest even, so a write must ask for exactly that; anything else raises."""
    k = inst.f["simm16"]
    hw, off, size = k & 0x3F, (k >> 6) & 0x1F, ((k >> 11) & 0x1F) + 1
    if hw != HW_REG_MODE: raise UnsupportedInstruction(f"{inst.name} of hardware register {hw} at {w.pc:#x}")
    mode = 0xF0  # FP_ROUND 0 (nearest even), FP_DENORM 0xF (keep float32 and float16/64 denormals)
    if inst.op == 17:
      self.swrite(w, inst.f["sdst"], (mode >> off) & ((1 << size) - 1))
      return
    v = (inst.literal or 0) if inst.op == 20 else self.sread(w, inst.f["sdst"], inst)
    mask = ((1 << size) - 1) << off
    if ((v << off) & mask) != (mode & mask) or off + size > 8:
      raise UnsupportedInstruction(f"{inst.name}: MODE[{off + size - 1}:{off}] = {v:#x} (only round-to-nearest with "
                                   f"denormals kept is emulated) at {w.pc:#x}")

  # vector compares
  def g9vopc(self, w: Wave, inst: Inst) -> None:
    """V_CMP/V_CMPX (e32: result to VCC, e64: to an SGPR pair); V_CMPX also writes EXEC (GFX9 writes both)."""
    f, rop = inst.f, inst.op
    if rop < 0 or f["clamp"] or f["omod"] or f["opsel"]:
      raise UnsupportedInstruction(f"{inst.name} at {w.pc:#x}" + (": clamp/omod/op_sel" if rop >= 0 else ""))
    try: _, fn = vopc_compare(rop)
    except UnsupportedInstruction: raise UnsupportedInstruction(f"{inst.name} at {w.pc:#x}") from None
    base = rop & 0x7F
    width = 16 if base < 0x10 or 0x30 <= base < 0x40 or base == 0x7D else 64 if 0x20 <= base < 0x30 or \
      0x50 <= base < 0x60 or base == 0x7F else 32
    fp, klass = base < 0x30 or base in (0x7D, 0x7E, 0x7F), base in (0x7D, 0x7E, 0x7F)
    lanes, cols = w.lanes(), []
    for i in range(2):
      code = f[f"src{i}"]
      if klass and i == 1:  # V_CMP_CLASS: src1 is a 32-bit class mask (bits 0..9), whatever the float width
        cols.append(self.col(w, code, lanes, inst))
        continue
      if width == 64: c = [self.vsrc64(w, code, ln, inst, fp) for ln in lanes]
      elif width == 16:
        if fp and code in INLINE_F32: c = [_f16_bits(f32(INLINE_F32[code]))] * len(lanes)
        else: c = [v & 0xFFFF for v in self.col(w, code, lanes, inst)]
      else: c = self.col(w, code, lanes, inst)
      if fp:
        sign = 1 << (width - 1)
        if f["abs"] >> i & 1: c = [v & ~sign for v in c]
        if f["neg"] >> i & 1: c = [v ^ sign for v in c]
      cols.append(c)
    mask = sum(1 << ln for ln, a, b in zip(lanes, *cols) if fn(a, b))
    self.wmask(w, f["sdst"], mask)
    if rop & 0x80: w.exec = mask

  # 16-bit ALU
  def g9v16(self, w: Wave, inst: Inst) -> None:
    """16-bit VALU: legacy ops read the low half of each source (VOP3: op_sel picks halves of the op_sel ops) and
    write the result zero-extended; the op_sel VOP3 ops (v_fma_f16, v_mad_u16, v_min3_f16, ...) write the half
    op_sel[3] picks and keep the other. v_cvt_f16_f32 / v_cvt_f32_f16 convert between the widths."""
    f, name = inst.f, inst.name.rsplit("_e", 1)[0] if inst.name.endswith(("_e32", "_e64")) else inst.name
    if f["omod"] or f["clamp"]: raise UnsupportedInstruction(f"{inst.name}: omod/clamp at {w.pc:#x}")
    lanes = w.lanes()
    if name in ("v_cvt_f16_f32", "v_cvt_f32_f16"):
      if f["opsel"]: raise UnsupportedInstruction(f"{inst.name}: op_sel at {w.pc:#x}")
      src = self.col(w, f["src0"], lanes, inst) if name == "v_cvt_f16_f32" or f["src0"] not in INLINE_F32 else \
        [_f16_bits(f32(INLINE_F32[f["src0"]]))] * len(lanes)
      if name == "v_cvt_f16_f32":
        src = [self._f32_mods(v, 0, f) for v in src]
        self.store(w, f["vdst"], lanes, [_f16_bits(f32(v)) for v in src])
      else:
        h = [(v & 0xFFFF & (0x7FFF if f["abs"] & 1 else 0xFFFF)) ^ (0x8000 if f["neg"] & 1 else 0) for v in src]
        self.store(w, f["vdst"], lanes, [bits32(_f16(v)) for v in h])
      return
    n, fp, fn, legacy = OPS16[name]
    if legacy and f["opsel"]: raise UnsupportedInstruction(f"{inst.name}: op_sel on a legacy 16-bit op at {w.pc:#x}")
    cols = []
    for i in range(n):
      code, sh = f[f"src{i}"], 16 * (f["opsel"] >> i & 1)
      if fp and code in INLINE_F32: c = [_f16_bits(f32(INLINE_F32[code]))] * len(lanes)
      elif code == LITERAL: c = [(inst.literal or 0) & 0xFFFF] * len(lanes)
      else: c = [(v >> sh) & 0xFFFF for v in self.col(w, code, lanes, inst)]
      if fp and f["abs"] >> i & 1: c = [v & 0x7FFF for v in c]
      if fp and f["neg"] >> i & 1: c = [v ^ 0x8000 for v in c]
      elif not fp and (f["abs"] >> i & 1 or f["neg"] >> i & 1):
        raise UnsupportedInstruction(f"{inst.name}: abs/neg on an integer op at {w.pc:#x}")
      cols.append(c)
    res = vec_f16(fn, *cols)
    if legacy: self.store(w, f["vdst"], lanes, [v & 0xFFFF for v in res])
    else: self.store16(w, f["vdst"], f["opsel"] >> 3 & 1, lanes, res)

  # SDWA
  SEL_SHIFT = {0: (0, 8), 1: (8, 8), 2: (16, 8), 3: (24, 8), 4: (0, 16), 5: (16, 16), 6: (0, 32)}

  def g9sdwa(self, w: Wave, inst: Inst) -> None:
    """VOP1/VOP2/VOPC with SDWA: each source is a byte/word of its register (zero- or sign-extended; S0/S1: an SGPR),
    the result goes to a byte/word of the destination with the other bits zeroed, sign-extended or kept (DST_UNUSED
    PAD/SEXT/PRESERVE); VOPC writes VCC or, with SD, the SGPR pair in SDST. The plain op runs on hidden registers v257
    (src0), v258 (src1) and v259 (its result)."""
    d, kind, inner = inst.f["sdwa"], inst.f["kind"], inst.f["inner"]
    assert isinstance(inner, Inst)
    base = inner.name.rsplit("_e32", 1)[0]
    fp16 = inner.fmt == "G9V16" and (OPS16[base][1] if base in OPS16 else base == "v_cvt_f32_f16")
    fp32 = not fp16 and "_f32" in base
    lanes = w.lanes()
    srcs = [(d & 0xFF, d >> 23 & 1, (d >> 16) & 7, d >> 19 & 1, d >> 20 & 1, d >> 21 & 1)]
    if kind != 1: srcs.append((inst.f["vsrc1"], d >> 31 & 1, (d >> 24) & 7, d >> 27 & 1, d >> 28 & 1, d >> 29 & 1))
    for i, (reg, is_s, sel, sx, neg, ab) in enumerate(srcs):
      vals = [self.sread(w, _sc(reg), inst)] * len(lanes) if is_s else self.col(w, 256 + reg, lanes, inst)
      sh, nb = self.SEL_SHIFT[sel]
      vals = [(v >> sh) & ((1 << nb) - 1) for v in vals]
      if sx and nb < 32: vals = [sext(v, nb) & MASK32 for v in vals]
      if ab or neg:
        if not (fp16 or fp32): raise UnsupportedInstruction(f"{inst.name}: SDWA abs/neg on an integer op at {w.pc:#x}")
        sign = 0x8000 if fp16 else 0x80000000
        vals = [((v & ~sign) if ab else v) ^ (sign if neg else 0) for v in vals]
      self.store(w, 257 + i, lanes, vals)
    g: dict[str, Any] = {**inner.f, "src0": 256 + 257}
    if kind != 1:
      if "vsrc1" in g: g["vsrc1"] = 258
      else: g["src1"] = 256 + 258
    run = getattr(self, inner.fmt.lower())
    if kind == 3:
      if d >> 15 & 1: g["sdst"] = _sc((d >> 8) & 0x7F)
      elif (d >> 8) & 0x7F: raise UnsupportedInstruction(f"{inst.name}: SDST without SD at {w.pc:#x}")
      run(w, Inst(inner.fmt, inner.op, g, 8, inner.name))
      return
    if (d >> 13) & 7: raise UnsupportedInstruction(f"{inst.name}: SDWA clamp/omod at {w.pc:#x}")
    vdst, g["vdst"] = g["vdst"], 259
    run(w, Inst(inner.fmt, inner.op, g, 8, inner.name))
    dsel, unused = (d >> 8) & 7, (d >> 11) & 3
    sh, nb = self.SEL_SHIFT[dsel]
    res, old, out = w.vgpr[259], w.vgpr[vdst], []
    m = ((1 << nb) - 1) << sh
    for ln in lanes:
      v = (res[ln] << sh) & m
      if unused == 2: v |= old[ln] & ~m & MASK32
      elif unused == 1 and nb < 32 and (v >> (sh + nb - 1)) & 1: v |= MASK32 & ~((1 << (sh + nb)) - 1)
      out.append(v)
    self.store(w, vdst, lanes, out)

  # 64-bit moves and adds, lane counts, packed float32
  def g9mov64(self, w: Wave, inst: Inst) -> None:
    """v_mov_b64: a 64-bit VGPR pair from a VGPR pair, an SGPR pair, an inline constant (a float one as a double) or a
    32-bit literal (its operand is a 64-bit integer: LLVM emits one for a constant below 2**31, such as an int64 index
    offset of 80, where zero and sign extension agree; any other literal raises, as in `sread64`)."""
    f = inst.f
    if f["abs"] or f["neg"] or f["clamp"] or f["omod"]: raise UnsupportedInstruction(f"{inst.name}: modifiers")
    lanes = w.lanes()
    if f["src0"] == LITERAL:
      if (inst.literal or 0) >= 1 << 31: raise UnsupportedInstruction(f"{inst.name}: a literal >= 2**31 at {w.pc:#x}")
      v = [inst.literal or 0] * len(lanes)
    else: v = [self.vsrc64(w, f["src0"], ln, inst, fp=f["src0"] in INLINE_F32) for ln in lanes]
    self.store(w, f["vdst"], lanes, [x & MASK32 for x in v])
    self.store(w, f["vdst"] + 1, lanes, [x >> 32 for x in v])

  def g9vop3(self, w: Wave, inst: Inst) -> None:
    f, op, lanes = inst.f, inst.op, w.lanes()
    if f["abs"] or f["neg"] or f["clamp"] or f["omod"] or f["opsel"]:
      raise UnsupportedInstruction(f"{inst.name}: modifiers at {w.pc:#x}")
    if op == 520:  # v_lshl_add_u64: D = (S0 << S1[2:0]) + S2, 64-bit
      a, c = self.col64(w, f["src0"], lanes, inst), self.col64(w, f["src2"], lanes, inst)
      sh = self.col(w, f["src1"], lanes, inst)
      r = [((x << (s & 7)) + z) & MASK64 for x, s, z in zip(a, sh, c)]
      self.store(w, f["vdst"], lanes, [x & MASK32 for x in r])
      self.store(w, f["vdst"] + 1, lanes, [x >> 32 for x in r])
    elif op in (652, 653):  # v_mbcnt_lo/hi_u32_b32: D = popcount(S0 & the mask bits of lanes below this one) + S1
      a, b = self.col(w, f["src0"], lanes, inst), self.col(w, f["src1"], lanes, inst)
      below = [((1 << ln) - 1) if op == 652 else ((1 << ln) - 1) >> 32 for ln in lanes]
      self.store(w, f["vdst"], lanes, [(_popcount(x & m & MASK32) + y) & MASK32 for x, y, m in zip(a, b, below)])
    else:
      fn = VOP3_EXTRA[inst.name]
      self.store(w, f["vdst"], lanes, list(map(fn, *(self.col(w, f[f"src{i}"], lanes, inst) for i in range(3)))))

  def g9vop3p(self, w: Wave, inst: Inst) -> None:
    """v_pk_fma/mul/add_f32 (each half of the 64-bit result from the 32-bit halves op_sel / op_sel_hi pick, neg_lo /
    neg_hi negating them), v_pk_mov_b32 (D.lo = S0[op_sel[0]], D.hi = S1[op_sel[1]]), v_accvgpr_read/write_b32."""
    f, op, lanes = inst.f, inst.op, w.lanes()
    if op in (88, 89):  # v_accvgpr_read_b32 (v <- a) / v_accvgpr_write_b32 (a <- v or a constant)
      if op == 88: vals = [w.agpr[f["src0"] - 256][ln] for ln in lanes]  # type: ignore[attr-defined]
      else: vals = self.col(w, f["src0"], lanes, inst)
      dst = w.vgpr if op == 88 else w.agpr  # type: ignore[attr-defined]
      for ln, v in zip(lanes, vals): dst[f["vdst"]][ln] = v
      return
    if op not in (48, 49, 50, 51) or f["clamp"]: return self.g9bad(w, inst)
    n = 3 if op == 48 else 2
    halves = []
    for i in range(n):
      code = f[f"src{i}"]
      if code >= 256: lo, hi = self.col(w, code, lanes, inst), self.col(w, code + 1, lanes, inst)
      elif code < 106 or code in (VCC_LO, 126): lo, hi = [w.sgpr[code]] * len(lanes), [w.sgpr[code + 1]] * len(lanes)
      else: lo = hi = [self.sread(w, code, inst)] * len(lanes)
      halves.append((lo, hi))
    def pick(i: int, hi_result: int) -> list[int]:
      sel = (f["opsel_hi"] if hi_result else f["opsel"]) >> i & 1
      c = halves[i][sel]
      if op != 51 and ((f["neg_hi"] if hi_result else f["neg"]) >> i & 1): c = [v ^ 0x80000000 for v in c]
      return c
    if op == 51: lo, hi = halves[0][f["opsel"] & 1], halves[1][f["opsel"] >> 1 & 1]
    else:
      fns: dict[int, Callable[..., float]] = {48: r3._fma, 49: operator.mul, 50: operator.add}
      fn = fns[op]
      lo, hi = vec_f32(fn, *(pick(i, 0) for i in range(n))), vec_f32(fn, *(pick(i, 1) for i in range(n)))
    self.store(w, f["vdst"], lanes, lo)
    self.store(w, f["vdst"] + 1, lanes, hi)

  # matrix cores
  def g9mfma(self, w: Wave, inst: Inst) -> None:
    """V_MFMA_F32_16X16X16_{F16,BF16} (wave64, one block): lane l holds A[l%16][4*(l//16)+e] (src0, 2 VGPRs, e =
    0..3 from the low half up), B[4*(l//16)+e][l%16] (src1) and C/D[4*(l//16)+i][l%16] in VGPR (or AGPR with ACC_CD)
    i of 4; D = A x B + C with the products summed exactly and rounded once to float32."""
    f = inst.f
    if f["cbsz"] or f["abid"] or f["blgp"] or f["acc"]:
      raise UnsupportedInstruction(f"{inst.name}: CBSZ/ABID/BLGP/ACC (broadcast, lane swizzle, AGPR A/B) at {w.pc:#x}")
    if w.exec != MASK64: raise UnsupportedInstruction(f"{inst.name} needs all 64 lanes in EXEC, got {w.exec:#x}")
    if f["src0"] < 256 or f["src1"] < 256: raise UnsupportedInstruction(f"{inst.name}: A and B must be VGPRs")
    cvt = MFMA[inst.op]
    acc: Any = w.agpr if f["acc_cd"] else w.vgpr  # type: ignore[attr-defined]
    a0, b0 = f["src0"] - 256, f["src1"] - 256
    def elems(base: int, ln: int) -> list[float]:
      return [cvt(w.vgpr[base + e // 2][ln] >> (16 * (e % 2))) for e in range(4)]
    A, B = [[0.0] * 16 for _ in range(16)], [[0.0] * 16 for _ in range(16)]
    for ln in range(64):
      for e, x in enumerate(elems(a0, ln)): A[ln % 16][4 * (ln // 16) + e] = x
      for e, x in enumerate(elems(b0, ln)): B[4 * (ln // 16) + e][ln % 16] = x
    Bt = [list(col) for col in zip(*B)]
    c_regs = None if f["src2"] < 256 else f["src2"] - 256
    const = self.sread(w, f["src2"], inst) if c_regs is None else 0
    out = [[0] * 64 for _ in range(4)]
    for i in range(4):
      for ln in range(64):
        m, n = 4 * (ln // 16) + i, ln % 16
        c = f32(acc[c_regs + i][ln] if c_regs is not None else const)
        out[i][ln] = bits32(math.fsum([*(x * y for x, y in zip(A[m], Bt[n])), c]))
    for i in range(4): acc[f["vdst"] + i] = out[i]


__all__ = ["CDNA3Emulator", "decode9", "SCC_SRC"]
