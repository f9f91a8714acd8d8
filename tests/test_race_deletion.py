"""Race mode over the production kernels: deleting any one s_waitcnt / s_barrier of a shipped
gfx950 code object must raise RaceError on the inputs below, launched through the real op path
(mxgemm.launcher.emulator_settings(asm_edit=...)). A deletion that cannot raise is either a
repeat of an at-least-as-strong wait earlier in its basic block with no load in between, or
listed in REDUNDANT with the reason; either way the test proves the line is reached on these
inputs (an s_trap in its place must fire), so inputs that skip a wait (e.g. all-padding tiles)
cannot pass for redundancy.

Default run: a deterministic sample, the last registered variant of each kernel (its largest
tiles, ~30 s CPU in all). MXGEMM_RACE_SWEEP=all runs every variant (625 deletions).
"""
import os
import re

import pytest
import torch

import mxgemm
from mxgemm import build, quant, registry, routing
from mxgemm.emu import EmulatorFault, RaceError
from mxgemm.launcher import emulator_settings

SYNC = re.compile(r"\s*(s_waitcnt|s_barrier)\b")


def sync_lines(asm):
    return [i for i, l in enumerate(asm.splitlines()) if SYNC.match(l)]


def _mx(rows, k, seed, fmt="e4m3"):
    g = torch.Generator().manual_seed(seed)
    return quant.quantize_mx(torch.randn(rows, k, generator=g), fmt)


def _dequant(language):
    def run(v):
        x, s = _mx(9, 128, 0)  # 1152 elements: one full workgroup (4 per thread), one partial
        mxgemm.mxfp8_dequantize(x, s, language=language)
    return run


def _smallm(kernel):
    def run(v):  # one workgroup; K covers several K steps per lane (GEMV) / per slice (MFMA)
        m = v["M_TILE"]
        n = 16 * v["N_SUB"] if "N_SUB" in v else 64 // v["SPLIT_K"]
        k = 1024 if "N_SUB" in v else 256 * v["SPLIT_K"]
        a, sa = _mx(m, k, 1)
        b, sb = _mx(n, k, 2)
        mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config={"kernel": kernel, **v}, fallback="error")
    return run


def _moe_mxfp8(v):  # expert 0: 6 real rows + 2 padding rows (two live M_CHUNKs); expert 1: one row
    T, K, N = 7, 256, v["BLOCK_N"]
    ids = torch.tensor([[0], [0], [0], [1], [0], [0], [0]])
    srt = routing.moe_sorting(ids, torch.rand(T, 1) + 0.5, 2, block_m=8)
    a, sa = _mx(T, K, 3)
    w, sw = _mx(2 * N, K, 4)
    mxgemm.moe_mxfp8_grouped_gemm(a, sa, w.view(2, N, K), sw.view(2, N, K // 32), srt.sorted_token_ids,
                                  srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=srt.sorted_weights
                                  .new_ones(T, 1), block_m=8, config=v, fallback="error")


def _a4w4(backend):
    def run(v):  # 20 real rows in one expert: both m-tiles of BM=32 live; K = 3 steps (pair loop + tail)
        T, K, N = 20, 768, 256
        srt = routing.moe_sorting(torch.zeros(T, 1, dtype=torch.int64), torch.rand(T, 1) + 0.5, 1,
                                  block_m=v["BM"])
        a, sa = _mx(T, K, 5, "e2m1")
        w, sw = _mx(N, K, 6, "e2m1")
        out = torch.zeros(T, N, dtype=torch.bfloat16)
        mxgemm.moe_gemm2_a4w4(a, sa, w[None], sw[None], srt.sorted_token_ids, srt.sorted_expert_ids,
                              srt.num_valid_ids, srt.sorted_weights, out, block_m=v["BM"], nt=v["NT"],
                              backend=backend)
    return run


def _grouped_fp8(v):
    """TN: sizes that make the op pick variant v, one K step + a 2-row tail, then a short group.
    NT / NN (variant forced by config, a persistent grid of 1): nine groups, so the group scans
    run the compiler's 8- and 4-unrolled bodies and their remainders, of sizes bm + 2, 0 x 7 and
    bm - 2 (a partial second row tile); K = three steps, so the K loop runs its 2-unrolled body
    and its remainder step."""
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    qa, qb = (lambda *s, f=f: torch.randn(*s, generator=torch.Generator().manual_seed(7)).to(fp8[v[f]])
              for f in ("FMT", "FMT_B"))
    bm, bn, one = v["BM"], v["BN"], torch.ones(1)
    kw = dict(out_dtype=torch.bfloat16 if v["OUT"] == "bf16" else torch.float16)
    if v["LAYOUT"] == "TN":
        lens = torch.tensor([130, 3])
        args, op = (qa(133, bm), one, qb(133, bn), one, lens), "grouped_gemm_fp8_variable_k"
    else:
        lens, trans_b, K = torch.tensor([bm + 2] + [0] * 7 + [bm - 2]), v["LAYOUT"] == "NT", 384
        args, op = (qa(2 * bm, K), one, qb(9, bn, K) if trans_b else qb(9, K, bn), one, lens), \
            "grouped_gemm_fp8_kernel"
        kw.update(trans_b=trans_b, num_cu=1, config=dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0))
    assert mxgemm.explain(op, *args, **kw).variant == v
    getattr(mxgemm, op)(*args, **kw)


def _deep_gemm(v):
    """Groups of 40, 0 and 23 rows (full, skipped and partial BM tiles; masked, or contiguous with
    each group padded to 128 rows), K = 1, 6 and 7 blocks, the 7th partial (the compiler unrolls
    the K loop: 6 and 7 leave remainder steps for unroll factors 2 and 4; with 6 the dead
    prefetch DMA of the last step lands in LDS buffer 0, where the epilogue's C tile goes; 1
    takes the path that skips the unrolled loop)."""
    for K in (128, 768, 848):
        _deep_gemm_k(v, K)


def _deep_gemm_k(v, K):
    g = torch.Generator().manual_seed(7)
    G, m_max, N = 3, 40, v["BN"]
    group_rows = torch.tensor([40, 0, 23], dtype=torch.int32)
    if v["MASKED"]:
        rows, layout = (G, m_max), group_rows
    else:
        rows, layout = (G * 128,), torch.arange(G, dtype=torch.int32).repeat_interleave(128)
        layout[torch.arange(G * 128) % 128 >= group_rows.repeat_interleave(128)] = -1
    a = torch.randn(*rows, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(G, N, K, generator=g).to(torch.float8_e4m3fn)
    sf = (lambda *s: torch.randint(120, 134, s, generator=g, dtype=torch.uint8)) if v["UE8M0"] else \
        (lambda *s: torch.rand(*s, generator=g) + 0.5)
    out = torch.zeros(*rows, N, dtype=torch.bfloat16 if v["OUT"] == "bf16" else torch.float16)
    args = (a, sf(*rows, -(-K // 128)), b, sf(G, -(-N // 128), -(-K // 128)), layout, out)
    kw = dict(masked=bool(v["MASKED"]), config=f"{v['BM']}x{v['BN']}")
    assert mxgemm.explain("deep_gemm_fp8_grouped_gemm", *args, **kw).variant == v
    mxgemm.deep_gemm_fp8_grouped_gemm(*args, **kw)


def _mx_gemm(v):
    """One workgroup with a partial row and column tile; 3 and 4 K steps per split (odd and even:
    the compiler unrolls the K loop by 2), two K splits for SPLITK variants."""
    splits = 2 if v["SPLITK"] else 1
    for steps in (3, 4):
        K = 128 * steps * splits
        a, sa = _mx(v["BM"] - 3, K, 8, v["A_FMT"])
        b, sb = _mx(max(32, v["BN"] - 32), K, 9, v["B_FMT"])
        kw = dict(a_format=v["A_FMT"], b_format=v["B_FMT"],
                  out_dtype={"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[v["OUT"]],
                  config={"BM": v["BM"], "BN": v["BN"], "SPLITS": splits})
        assert mxgemm.explain("mx_gemm", a, sa, b, sb, **kw).variant == v
        mxgemm.mx_gemm(a, sa, b, sb, **kw)


RUNNERS = {
    "mxfp8_dequant": _dequant("hip"), "mxfp8_dequant_flydsl": _dequant("flydsl"),
    "smallm_mxfp8_gemv": _smallm("smallm_mxfp8_gemv"), "smallm_mxfp8_mfma": _smallm("smallm_mxfp8_mfma"),
    "smallm_mxfp8_moe_grouped_gemm": _moe_mxfp8,
    "moe_gemm2_a4w4": _a4w4("hip"), "moe_gemm2_a4w4_flydsl": _a4w4("flydsl"),
    "grouped_gemm_fp8": _grouped_fp8,
    "deep_gemm_fp8": _deep_gemm,
    "mx_gemm": _mx_gemm,
}

# Deletions that raise no RaceError on any input: (kernel, variant ids or None for all, sync line,
# first memory instruction after it, why). Each must still be reached on the inputs above
# (checked with an s_trap in its place).
_WAVE_LOCAL = ("M_TILE * N_SUB = 16 gives 256 output slots, slot o read by thread o and written by "
               "the 16 lanes of its own wave: no LDS data crosses waves")
REDUNDANT = (
    ("moe_gemm2_a4w4", None, "s_waitcnt lgkmcnt(0)", "global_load_dword",
     "epilog entry: the kernarg s_load before the K loop is retired by the loop's or the tail's "
     "lgkmcnt(0) on every path (K >= 256)"),
    ("moe_gemm2_a4w4_flydsl", None, "s_waitcnt lgkmcnt(0)", "global_atomic_pk_add_bf16",
     "second m-tile's epilog: the out-pointer s_load is retired in the first m-tile's epilog, which "
     "runs whenever the second does (a block's real rows precede its padding)"),
    ("grouped_gemm_fp8", tuple(registry.variant_id(v) for v in registry.get("grouped_gemm_fp8").variants
                               if v["BM"] == 64 and v["LAYOUT"] != "TN"), "s_waitcnt lgkmcnt(0)", None,
     "barrier of the K loop's last step (the remainder after the 2-unrolled body): its ds_writes are the "
     "dead prefetch of step K/128 (all-zero loads); that LDS buffer is next read after the next tile's "
     "prologue barrier, which every wave reaches through an lgkmcnt(0) that retires these writes too"),
    ("smallm_mxfp8_gemv", ("M_TILE16_N_SUB1", "M_TILE8_N_SUB2"), "s_waitcnt lgkmcnt(0)", "ds_read_b128",
     _WAVE_LOCAL),
    ("smallm_mxfp8_gemv", ("M_TILE16_N_SUB1", "M_TILE8_N_SUB2"), "s_barrier", "ds_read_b128", _WAVE_LOCAL),
    ("smallm_mxfp8_mfma", ("M_TILE16_SPLIT_K2",), "s_waitcnt lgkmcnt(0)", "global_store_short",
     "epilog store i > 0: it runs only if store 0 (a smaller row, same column) ran, whose wait "
     "retired the split-K ds_read"),
)
MEMORY = re.compile(r"\s*(buffer_|global_|flat_|scratch_|ds_|s_load|s_buffer_load|s_store|s_atomic)")
# the wait counters each class of memory instruction counts in (gfx9: LDS and scalar memory in
# lgkmcnt, vector memory in vmcnt, flat in both)
COUNTED = ((re.compile(r"\s*(ds_|s_load|s_buffer_load|s_store|s_atomic)"), {"lgkmcnt"}),
           (re.compile(r"\s*(buffer_|global_|scratch_)"), {"vmcnt"}),
           (re.compile(r"\s*flat_"), {"vmcnt", "lgkmcnt"}))
BLOCK_END = re.compile(r"\s*(s_cbranch|s_branch|s_setpc|s_endpgm|\S+:)")
COUNTERS = re.compile(r"(vmcnt|lgkmcnt|expcnt)\((\d+)\)")


def repeats_earlier_wait(lines, i):
    """Why deleting s_waitcnt line i is harmless when an at-least-as-strong s_waitcnt precedes it
    in the same basic block with no memory instruction counted by its counters in between, weaker
    waits allowed between (None otherwise)."""
    want = dict((c, int(n)) for c, n in COUNTERS.findall(lines[i]))
    for j in range(i - 1, -1, -1):
        text = lines[j].split(";")[0]
        if not text.strip():
            continue
        counted = next((cs for pattern, cs in COUNTED if pattern.match(text)), set())
        if counted & set(want) or BLOCK_END.match(text) or not want:
            return None
        if text.strip().startswith("s_waitcnt"):
            had = dict((c, int(n)) for c, n in COUNTERS.findall(text))
            if all(c in had and had[c] <= n for c, n in want.items()):
                return f"repeats the wait at line {j + 1}; nothing it counts issued in between"
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
    assert {k for k, spec in registry.KERNELS.items() if "gfx950" in spec.archs} <= set(RUNNERS)


@pytest.mark.parametrize("kernel,variant", CASES)
def test_deleting_any_wait_or_barrier_raises_race_error(kernel, variant):
    run = RUNNERS[kernel]
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
