"""Race mode over the production kernels: deleting any one s_waitcnt / s_barrier of a shipped
gfx950 code object must raise RaceError on the inputs below, launched through the real op path
(mxgemm.launcher.emulator_settings(asm_edit=...)). A deletion that cannot raise is either a
repeat of an at-least-as-strong wait earlier in its basic block with no load in between, or
listed in REDUNDANT with the reason; either way the test proves the line is reached on these
inputs (an s_trap in its place must fire), so inputs that skip a wait (e.g. all-padding tiles)
cannot pass for redundancy.

Default run: a deterministic sample, the last registered variant of each kernel (its largest
tiles, ~30 s CPU in all). MXGEMM_RACE_SWEEP=all runs every variant (the block-scale kernel's
alone: about three hours, 24 minutes for each 128 x 128 variant with sfa windows).
"""
import functools
import os
import re

import pytest

from mxgemm import build, registry, specs
from mxgemm.emu import EmulatorFault, RaceError
from mxgemm.launcher import emulator_settings

SYNC = re.compile(r"\s*(s_waitcnt|s_barrier)\b")


def sync_lines(asm):
    return [i for i, l in enumerate(asm.splitlines()) if SYNC.match(l)]


# Deletions that raise no RaceError on any input: (kernel, variant ids or None for all, sync line,
# first memory instruction after it, why). Each must still be reached on the inputs above
# (checked with an s_trap in its place).
_WAVE_LOCAL = ("M_TILE * N_SUB = 16 gives 256 output slots, slot o read by thread o and written by "
               "the 16 lanes of its own wave: no LDS data crosses waves")
_MOE_WAVE_LOCAL = ("BLOCK_N * M_CHUNK = 256 output slots, slot o read by thread o from the 4 lanes of its own "
                   "weight row, threads 4 * (o / 4) .. + 3 of its own wave: no LDS data crosses waves, before the "
                   "reads or before the next chunk's writes")
_MOE_MFMA_LGKM = ("the MFMA chunk uses no LDS but ds_bpermute (lane exchange, no memory shared between waves), and "
                  "each ds_bpermute's result is waited for before it is read; the expert id's s_load is retired "
                  "right after it is issued: no LGKM operation whose result is still to be read is outstanding here")
_WINDOW_EPILOGUE = ("epilogue entry with sfa windows: every path into it last issued a K step's DMAs, after that "
                    "step's sfb load and any window loads, so the higher vmcnt above retires every load into "
                    "registers; the DMAs this wait retires write LDS only, and the vmcnt(0) and barrier below come "
                    "before the C tile's LDS writes")
_WINDOW_32 = tuple(f"BM32_BN32_MASKED{m}_OUT{o}_SFA_KMAJOR1_UE8M00" for m in (0, 1) for o in ("bf16", "f16")) + (
    "BM32_BN32_MASKED0_OUTbf16_PSUM1_SFA_KMAJOR1_UE8M00",)
REDUNDANT = (
    ("smallm_mxfp8_mfma", tuple(registry.variant_id(v) for v in registry.get("smallm_mxfp8_mfma").variants
                               if v["SPLIT_K"] == 1), "s_waitcnt lgkmcnt(0)", "global_store_short",
     "epilog store of a row after the tile's first (no split-K reduction, so no LDS wait before): the out "
     "pointer's s_load is retired by the first store's wait, and a lane stores a later row only if it stored "
     "the first (rows ascend, one column per lane), so that block ran"),
    ("moe_gemm2_a4w4", None, "s_waitcnt lgkmcnt(0)", "global_load_dword",
     "epilog entry: the kernarg s_load before the K loop is retired by the loop's or the tail's "
     "lgkmcnt(0) on every path (K >= 256)"),
    *(("moe_gemm2_a4w4_flydsl", None, "s_waitcnt lgkmcnt(0)", out_op,
       "second m-tile's epilog: the out-pointer s_load is retired in the first m-tile's epilog, which "
       "runs whenever the second does (a block's real rows precede its padding)")
      for out_op in ("global_atomic_pk_add_bf16", "global_store_dwordx2")),   # summed / a row per route
    *(("moe_gemm2_a4w4_flydsl", tuple(registry.variant_id(v) for v in registry.get("moe_gemm2_a4w4_flydsl").variants
                                    if v["BM"] == 16), "s_waitcnt vmcnt(14)", out_op,
       "epilog: the wait for a top-k weight the prologue loaded (BM 16); every K step's barrier waits for "
       "vmcnt(0) first and the loop runs at least one step (K >= 256), so that load is retired")
      for out_op in ("global_atomic_pk_add_bf16", "global_store_dwordx2")),
    ("train_grouped_gemm", tuple(registry.variant_id(v) for v in registry.get("train_grouped_gemm").variants
                               if v["BM"] == 64 and v["LAYOUT"] != "TN"), "s_waitcnt lgkmcnt(0)", None,
     "barrier of the K loop's last step (the remainder after the 2-unrolled body): its ds_writes are the "
     "dead prefetch of step K/128 (all-zero loads); that LDS buffer is next read after the next tile's "
     "prologue barrier, which every wave reaches through an lgkmcnt(0) that retires these writes too"),
    ("train_grouped_gemm", ("BM256_BN256_FMTe4m3_FMT_Be4m3_LAYOUTTN_OUTbf16",), "s_barrier", "buffer_load_dwordx4",
     "a tile's first barrier (DMA tiles): it keeps a workgroup's next tile's first DMA off the LDS its waves "
     "still read for the previous tile; the variable-K op launches a workgroup per tile, so no TN "
     "workgroup runs a second one (the NT race inputs, a persistent grid of one, exercise it)"),
    ("blockscale_grouped_gemm", tuple(f"BM32_BN32_MASKED1_OUT{o}_UE8M00" for o in ("bf16", "f16")),
     "s_waitcnt vmcnt(2)", "ds_write_b64",
     "epilogue entry, masked 32 x 32: it retires an sfa load into the register the C tile reuses before "
     "the C tile is written. Past a tail step, that step's barrier wait (vmcnt(2)) retired it; past the "
     "loop, the load precedes the one the vmcnt(3) above waits for. Only a tile with no K step (a "
     "contiguous padding tile; a masked tile has K >= 1 block) needs it"),
    *(("blockscale_grouped_gemm", _WINDOW_32,
       "s_waitcnt lgkmcnt(0)", mem,
       "right after a step's ds_bpermute, 32 x 32 with sfa windows: the compiler pairs the step's promotion "
       "multiply with the next step's (one v_pk_mul of both scales), which reads the permuted scale after the "
       "next step's own lgkmcnt(0)") for mem in ("buffer_load_dwordx4", "global_load_dword")),
    *(("blockscale_grouped_gemm", _WINDOW_32,
       "s_waitcnt vmcnt(2)", mem,
       "a remainder step's barrier wait, 32 x 32 with sfa windows: the step before ends with the compiler's "
       "vmcnt(2) for its sfb load (read by its promotion v_pk_mul), and no vector-memory op is issued between "
       "the two (the branch between them ends the basic block)") for mem in ("buffer_load_dwordx4", "global_load_dword")),
    ("blockscale_grouped_gemm", tuple(f"BM64_BN128_MASKED{m}_OUTbf16_SFA_KMAJOR1_UE8M00" for m in (0, 1)),
     "s_waitcnt vmcnt(4)", "ds_write_b64", _WINDOW_EPILOGUE),
    *(("blockscale_grouped_gemm", tuple(f"BM128_BN128_MASKED0_OUT{o}_SFA_KMAJOR1_UE8M00" for o in ("bf16", "f16")),
       f"s_waitcnt vmcnt({n})", "ds_write_b64", _WINDOW_EPILOGUE) for n in (5, 2)),
    ("mx_gemm", tuple(f"A_FMTe2m1_BM64_BN64_B_FMTe2m1_NUM_BUFFERS2_OUT{o}_SPLITK0" for o in ("bf16", "f16")),
     "s_waitcnt vmcnt(0) lgkmcnt(0)", "ds_read_b128",
     "K-loop remainder step's barrier: its vmcnt(0) repeats the wait a few lines above, and the only LGKM "
     "op that can be outstanding there is the out-pointer s_load, first used in the epilogue after the "
     "step's own lgkmcnt(0)"),
    ("smallm_mxfp8_gemv", ("M_TILE16_N_SUB1", "M_TILE8_N_SUB2"), "s_waitcnt lgkmcnt(0)", "ds_read_b128",
     _WAVE_LOCAL),
    ("smallm_mxfp8_gemv", ("M_TILE16_N_SUB1", "M_TILE8_N_SUB2"), "s_barrier", "ds_read_b128", _WAVE_LOCAL),
    ("smallm_mxfp8_moe_grouped_gemm", ("BLOCK_N64_M_CHUNK4",), "s_waitcnt lgkmcnt(0)", "global_load_dword",
     _MOE_WAVE_LOCAL),
    ("smallm_mxfp8_moe_grouped_gemm", ("BLOCK_N64_M_CHUNK4",), "s_barrier", "ds_read_b128", _MOE_WAVE_LOCAL),
    ("smallm_mxfp8_moe_grouped_gemm", ("BLOCK_N64_M_CHUNK4",), "s_barrier", "buffer_load_dwordx4", _MOE_WAVE_LOCAL),
    ("smallm_mxfp8_moe_grouped_gemm", ("BLOCK_N64_M_CHUNK16",), "s_waitcnt lgkmcnt(1)", "global_load_dword",
     _MOE_MFMA_LGKM),
    ("smallm_mxfp8_moe_grouped_gemm", ("BLOCK_N64_M_CHUNK16",), "s_waitcnt lgkmcnt(0)", "ds_bpermute_b32",
     _MOE_MFMA_LGKM),
    ("smallm_mxfp8_mfma", ("M_TILE16_SPLIT_K2",), "s_waitcnt lgkmcnt(0)", "global_store_short",
     "epilog store i > 0: it runs only if store 0 (a smaller row, same column) ran, whose wait "
     "retired the split-K ds_read"),
)
MEMORY = re.compile(r"\s*(buffer_|global_|flat_|scratch_|ds_|s_load|s_buffer_load|s_store|s_atomic)")
BLOCK_END = re.compile(r"\s*(s_cbranch|s_branch|s_setpc|s_endpgm|\S+:)")
COUNTERS = re.compile(r"(vmcnt|lgkmcnt|expcnt)\((\d+)\)")


# The memory instructions each wait counter counts (gfx9: stores count in vmcnt too).
COUNTED = {"vmcnt": re.compile(r"\s*(buffer_|global_|flat_|scratch_)"),
           "lgkmcnt": re.compile(r"\s*(ds_|flat_|s_load|s_buffer_load|s_store|s_atomic|s_sendmsg)"),
           "expcnt": re.compile(r"\s*(buffer_store|buffer_atomic|global_store|global_atomic|flat_store|"
                                r"flat_atomic|scratch_store|exp\b)")}


def repeats_earlier_wait(lines, i):
    """Why deleting s_waitcnt line i is harmless when an at-least-as-strong s_waitcnt precedes it
    in the same basic block and no instruction in between is counted by the counters line i
    waits on (weaker waits allowed between); None otherwise."""
    want = dict((c, int(n)) for c, n in COUNTERS.findall(lines[i]))
    for j in range(i - 1, -1, -1):
        text = lines[j].split(";")[0]
        if not text.strip():
            continue
        if BLOCK_END.match(text) or not want or any(COUNTED[c].match(text) for c in want):
            return None
        if text.strip().startswith("s_waitcnt"):
            had = dict((c, int(n)) for c, n in COUNTERS.findall(text))
            if all(c in had and had[c] <= n for c, n in want.items()):
                return f"repeats the wait at line {j + 1}; nothing it counts was issued in between"
            # a weaker wait in between retires nothing: keep looking for a stronger one
    return None


def listed_reason(kernel, variant, lines, i):
    nxt = next((l.split()[0] for l in lines[i + 1:] if MEMORY.match(l)), None)
    vid = registry.variant_id(variant)
    return next((why for k, vids, sync, mem, why in REDUNDANT
                 if (k, sync, mem) == (kernel, lines[i].strip(), nxt) and (vids is None or vid in vids)), None)


def _edit(line, replacement):
    def edit(text):
        lines = text.splitlines()
        lines[line] = replacement
        return "\n".join(lines)
    return edit


def _sample(kernel):
    variants = registry.get(kernel).variants
    return variants if os.environ.get("MXGEMM_RACE_SWEEP") == "all" else variants[-1:]


CASES = [pytest.param(k, v, id=f"{k}-{registry.variant_id(v)}")
         for k, spec in registry.KERNELS.items() if "gfx950" in spec.archs for v in _sample(k)]


def test_every_gfx950_kernel_has_race_inputs():
    assert not specs.gfx950_kernels_without_spec()


@pytest.mark.parametrize("kernel,variant", CASES)
def test_deleting_any_wait_or_barrier_raises_race_error(kernel, variant):
    run = functools.partial(specs.race_outputs, kernel)
    lines = build.artifact(kernel, variant).asm.splitlines()
    run(variant)                                   # intact: no race
    missed, redundant = [], 0
    for i in sync_lines("\n".join(lines)):
        try:
            with emulator_settings(asm_edit=_edit(i, "\t; deleted")):
                run(variant)
        except RaceError:
            continue
        where = f"line {i + 1} ({lines[i].strip()})"
        reason = repeats_earlier_wait(lines, i) or listed_reason(kernel, variant, lines, i)
        if reason is None:
            missed.append(f"{where}: deleted without a RaceError")
            continue
        with pytest.raises(EmulatorFault, match="s_trap executed"), emulator_settings(
                asm_edit=_edit(i, "\ts_trap 2")):
            run(variant)                           # the redundant wait is on the executed path
        redundant += 1
        print(f"\n{kernel} {registry.variant_id(variant)} {where}: redundant, {reason}")
    assert not missed, f"{kernel} {registry.variant_id(variant)}: " + "; ".join(missed)
    print(f"\n{kernel} {registry.variant_id(variant)}: {len(sync_lines(chr(10).join(lines)))} deletions, "
          f"{redundant} redundant, the rest raise RaceError")
