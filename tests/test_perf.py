"""mxgemm.tools.perf: the model's arithmetic on hand-computed cases, its hot-loop counts against the
emulator's counters, and the `perf` command on the small preset."""
import importlib.util
import json

import pytest

from mxgemm import asm_facts, registry, specs
from mxgemm.__main__ import main
from mxgemm.build import artifact
from mxgemm.launcher import emulator_settings, last_emulator_stats
from mxgemm.specs import Case
from mxgemm.tools import perf

GFX950 = asm_facts.LIMITS["gfx950"]


# ---- arithmetic, one hand-computed case per op family ----
# (kernel, variant, shape, flops, compulsory bytes, grid, wave iterations); bytes written out term by term
HAND = [
    # 1x16x1024 MXFP8: a 1024 + 32 scales, b 16x1024 + 16x32, out 16 bf16; 2 K halves of 512 x 4 waves
    ("smallm_mxfp8_gemv", {"M_TILE": 1, "N_SUB": 1}, dict(M=1, N=16, K=1024),
     2 * 16 * 1024, 1024 + 32 + 16 * 1024 + 16 * 32 + 2 * 16, (1, 1, 1), 2 * 4),
    # 16x32x512: 2 column blocks of 16 (SPLIT_K 2: 2 waves per column), K steps of 128 shared by 2 waves,
    # two steps a loop iteration: 4 waves x 1 iteration
    ("smallm_mxfp8_mfma", {"M_TILE": 16, "SPLIT_K": 2}, dict(M=16, N=32, K=512),
     2 * 16 * 32 * 512, 16 * 512 + 16 * 16 + 32 * 512 + 32 * 16 + 2 * 16 * 32, (1, 1, 1), 4 * 1),
    # 3 tokens x top-4 of 4 experts: every expert active with 3 rows -> 4 live blocks of 16 sorted rows;
    # the grid has a row per block the 12 routes can fill, 4 + (12 - 4) // 16 = 4; out: the 12 routes' rows
    ("smallm_mxfp8_moe_grouped_gemm", {"BLOCK_N": 16, "M_CHUNK": 2}, dict(tokens=3, topk=4, experts=4, N=16, K=512),
     2 * 12 * 16 * 512, 3 * 512 + 3 * 16 + 4 * 16 * (512 + 16) + 2 * 12 * 16, (1, 4, 1), 4 * 2 * 4 * 1),
    # a4w4: 2 tokens x top-2 of 2 experts, fp4 rows of 512 bytes + 32 scales; out read + written;
    # grid: ceil((2 * 2 + 2 * 16 - 2) / 16) = 3 blocks; two 256-wide K steps per loop iteration
    ("moe_gemm2_a4w4", {"BM": 16, "NT": 0, "ROUTE_ROWS": 0}, dict(tokens=2, topk=2, experts=2, N=256, K=1024),
     2 * 4 * 256 * 1024, 4 * (512 + 32) + 2 * 256 * (512 + 32) + 2 * 2 * 2 * 256, (1, 3, 1), 2 * 4 * 2),
    # DeepGEMM masked, fp32 scales: sfa 32 rows x 4 blocks, sfb 1 x 4 blocks (4 bytes each)
    ("blockscale_grouped_gemm", {"BM": 32, "BN": 32, "MASKED": 1, "UE8M0": 0, "OUT": "bf16"}, dict(groups=1, m=32, N=32, K=512),
     2 * 32 * 32 * 512, 32 * 512 + 32 * 512 + 32 * 4 * 4 + 4 * 4 + 2 * 32 * 32, (1, 1, 1), 4 * 2),
    # grouped fp8 forward: 2 groups of 64 rows, tile bound (ceil(128 / 64) + 2) x 1; 64x64 tiles step K by 256
    ("train_grouped_gemm", {"LAYOUT": "NT", "FMT": "e4m3", "FMT_B": "e4m3", "OUT": "bf16", "BM": 64, "BN": 64},
     dict(groups=2, m=64, N=64, K=512), 2 * 2 * 64 * 64 * 512, 2 * 64 * 512 + 2 * 64 * 512 + 2 * 2 * 64 * 64,
     (4, 1, 1), 2 * 4 * 2),
    # dequant 8 x 1024: e4m3 in, 32 scales a row, fp32 out; one workgroup per 1024 elements
    ("mxfp8_dequant", {}, dict(M=8, K=1024), 0, 8 * 1024 + 8 * 32 + 4 * 8 * 1024, (8, 1, 1), 8 * 4),
]


@pytest.mark.parametrize("kernel,variant,shape,flops,nbytes,grid,wave_iters", HAND, ids=[h[0] for h in HAND])
def test_work_by_hand(kernel, variant, shape, flops, nbytes, grid, wave_iters):
    w = specs.work(Case(kernel, variant, shape, "t"))
    assert (w.flops, w.bytes, w.grid, w.wave_iterations) == (flops, nbytes, grid, wave_iters)


def test_roofline_and_mfma_cycles_by_hand():
    # per SIMD and clock: 5.0 PFLOP/s fp8 / (256 CUs x 4 SIMDs x 2.4 GHz) = 2034.5 FLOP
    fp8 = "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v20, v21 op_sel_hi:[0,0,0]"
    assert asm_facts.mfma_cycles(fp8) == pytest.approx(2 * 16 * 16 * 128 / (5.0e15 / (256 * 4 * 2.4e9)))
    assert asm_facts.mfma_cycles(fp8) == pytest.approx(32.2, abs=0.05)
    fp4 = "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:7], v[12:15], v[0:3], v20, v21 cbsz:4 blgp:4"
    assert asm_facts.mfma_cycles(fp4) == pytest.approx(65536 / (10.1e15 / (256 * 4 * 2.4e9)))   # ~15.9
    mixed = "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:15], v[0:3], v20, v21 blgp:4"
    assert asm_facts.mfma_cycles(mixed) == asm_facts.mfma_cycles(fp8)      # the slower operand sets the rate
    assert asm_facts.mfma_cycles("v_mfma_f32_32x32x16_bf16 a[0:15], v[0:3], v[4:7], a[0:15]") == \
        pytest.approx(2 * 32 * 32 * 16 / (2.5e15 / (256 * 4 * 2.4e9)))
    # a 1 x 1280 x 8192 GEMV is memory-bound: 8 KiB + 10.5 MB of e4m3 + scales over 8 TB/s
    row = perf.predict(Case("smallm_mxfp8_gemv", {"M_TILE": 1, "N_SUB": 1}, dict(M=1, N=1280, K=8192), "t"),
                       mca=False)
    nbytes = 8192 + 256 + 1280 * (8192 + 256) + 2 * 1280
    assert row["bytes"] == nbytes and row["roofline_us"] == pytest.approx(nbytes / 8e12 * 1e6)
    assert row["ai"] == pytest.approx(2 * 1280 * 8192 / nbytes)


# ---- the hot loop against the emulator's counters ----
_NT64 = {"FMT": "e4m3", "FMT_B": "e4m3", "OUT": "bf16", "BM": 64, "BN": 64}
# (kernel, variant, fixed shape, the dimension the hot loop runs over, two values of it)
LOOPS = [
    ("smallm_mxfp8_gemv", {"M_TILE": 2, "N_SUB": 1}, dict(M=2, N=16), "K", (1024, 2048)),
    ("smallm_mxfp8_mfma", {"M_TILE": 16, "SPLIT_K": 2}, dict(M=16, N=32), "K", (512, 1024)),
    ("smallm_mxfp8_moe_grouped_gemm", {"BLOCK_N": 16, "M_CHUNK": 2}, dict(tokens=3, topk=2, experts=4, N=16), "K",
     (512, 1024)),
    ("smallm_mxfp8_moe_grouped_gemm", {"BLOCK_N": 64, "M_CHUNK": 16}, dict(tokens=3, topk=2, experts=4, N=64), "K",
     (512, 1024)),
    ("moe_gemm2_a4w4", {"BM": 16, "NT": 0, "ROUTE_ROWS": 0}, dict(tokens=2, topk=2, experts=2, N=256), "K", (1024, 2048)),
    ("moe_gemm2_a4w4_flydsl", {"BM": 16, "NT": 0, "ROUTE_ROWS": 0}, dict(tokens=2, topk=2, experts=2, N=256), "K", (1024, 2048)),
    # 32 x 32 runs three K blocks of 128 per iteration: K in whole iterations
    ("blockscale_grouped_gemm", {"BM": 32, "BN": 32, "MASKED": 1, "UE8M0": 0, "OUT": "bf16"}, dict(groups=1, m=32, N=32), "K",
     (384, 768)),
    ("blockscale_grouped_gemm", {"BM": 32, "BN": 32, "MASKED": 1, "UE8M0": 1, "OUT": "bf16"}, dict(groups=1, m=32, N=32), "K",
     (768, 1536)),
    ("train_grouped_gemm", {"LAYOUT": "NT", **_NT64}, dict(groups=1, m=64, N=64), "K", (256, 512)),
    ("train_grouped_gemm", {"LAYOUT": "NN", **_NT64}, dict(groups=1, m=64, N=64), "K", (256, 512)),
    ("train_grouped_gemm", {"LAYOUT": "TN", **_NT64}, dict(groups=1, N=64, K=64), "m", (128, 256)),
    ("mxfp8_dequant", {}, dict(K=1024), "M", (8, 16)),
    ("mxfp8_dequant_flydsl", {}, dict(K=1024), "M", (8, 16)),
]
if "mx_gemm" in registry.KERNELS:   # the MX GEMM joins the registry from its own branch
    # the registered variants; K: whole loop iterations (MXFP4 stages two K steps, 256 K; at
    # 256 x 128 a loop iteration is two turns of three stages, 1536 K)
    LOOPS += [("mx_gemm", next(v for v in registry.get("mx_gemm").variants
                               if (v["A_FMT"], v["B_FMT"], v["BM"], v["BN"], v["OUT"], v["SPLITK"]) == (f, f, bm, bn, "bf16", 0)),
               dict(M=bm, N=bn), "K", (k, 2 * k))
              for f, bm, bn, k in (("e4m3", 64, 64, 512), ("e2m1", 128, 128, 512), ("e2m1", 256, 128, 1536))]


@pytest.mark.parametrize("kernel,variant,shape,dim,values", LOOPS,
                         ids=[f"{c[0]}-{'_'.join(map(str, c[1].values()))}" for c in LOOPS])
def test_hot_loop_counts_equal_emulator_counters(kernel, variant, shape, dim, values):
    """Growing the loop dimension adds exactly (static hot-loop counts) x (the model's extra
    wave-iterations) to every counter class of the emulator: the loop read from the assembly is
    the loop that runs, and the model counts its iterations right."""
    art = artifact(kernel, variant)
    loop = asm_facts.loop_profile(art.asm, art.symbol)
    stats, works = [], []
    for value in values:
        case = Case(kernel, variant, {**shape, dim: value}, "t")
        with emulator_settings(race_check=False):
            specs.op_call(case)()
        stats.append(last_emulator_stats())
        works.append(specs.work(case))
    extra = works[1].wave_iterations - works[0].wave_iterations
    assert extra > 0
    delta = {c: stats[1].get(c, 0) - stats[0].get(c, 0) for c in set(stats[0]) | set(stats[1])
             if c in loop.counts or c in ("mfma", "valu", "salu", "vmem_load", "lds_load", "waitcnt")}
    assert delta == {c: loop.counts.get(c, 0) * extra for c in delta}
    for c, nbytes in loop.bytes.items():   # full EXEC in the loop: bytes = per-lane size x 64 lanes
        assert stats[1][c + "_bytes"] - stats[0][c + "_bytes"] == nbytes * extra


# ---- the command ----
def test_perf_command_small_preset(capsys):
    assert main(["perf", "--preset", "small", "--no-mca"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["kernel", "variant", "case", "ai"]
    kernels = [l.split()[0] for l in lines[1:]]
    mx = "mx_gemm" in registry.KERNELS
    assert kernels == ["smallm_mxfp8_gemv", "smallm_mxfp8_mfma", "moe_gemm2_a4w4"] + ["mx_gemm"] * mx
    if not mx:                  # a preset kernel not registered yet is named, not dropped
        assert err == "note: kernel 'mx_gemm' (MX GEMM e4m3 1024^3) is not in the registry yet: skipped\n"


def test_perf_json_rows(capsys):
    assert main(["perf", "--preset", "small", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gemv = rows[0]
    if perf._llvm_mca() is None:           # no llvm-mca of LLVM >= 22 on PATH: the column says so
        assert {r["llvm_mca"] for r in rows} == {"no llvm-mca"}
    assert gemv["kernel"] == "smallm_mxfp8_gemv" and gemv["grid"] == "80x1x1"
    assert gemv["predicted_us"] >= gemv["roofline_us"] and 0 < gemv["roofline_fraction"] <= 1
    assert gemv["limit"] in ("memory", "MFMA issue", "instruction issue", "latency/occupancy", "tail")
    assert gemv["published"] == "not found"


def test_perf_errors(capsys, tmp_path):
    assert main(["perf", "--preset", "nosuch"]) == 1
    assert "unknown preset 'nosuch'" in capsys.readouterr().err
    assert main(["perf", "--preset", "small", "--no-mca", "--measure"]) == 1
    assert "--measure needs a gfx950 GPU (ROCm torch); this machine has no GPU" in capsys.readouterr().err
    if importlib.util.find_spec("matplotlib") is None:
        assert main(["perf", "--preset", "small", "--no-mca", "--plot", str(tmp_path / "r.png")]) == 1
        assert "--plot needs matplotlib" in capsys.readouterr().err


def test_legacy_fp8_mfma_runs_at_half_the_f8f6f4_rate():
    """gfx950's gfx940-style FP8 MFMAs take 16 (16x16x32) and 32 (32x32x16) cycles per LLVM's
    gfx950 scheduling model: half the FLOP rate of v_mfma_*_f8f6f4 with FP8 operands."""
    legacy16 = "v_mfma_f32_16x16x32_fp8_fp8 v[0:3], v[4:5], v[6:7], v[0:3]"
    legacy32 = "v_mfma_f32_32x32x16_bf8_fp8 v[0:15], v[4:5], v[6:7], v[0:15]"
    assert asm_facts.mfma_cycles(legacy16) == pytest.approx(16.1, abs=0.05)
    assert asm_facts.mfma_cycles(legacy32) == pytest.approx(32.2, abs=0.1)
