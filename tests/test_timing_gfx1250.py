"""The timing model on gfx1250 launches (machine "gfx1250-assumed", docs/timing_model.md §7):
microbenchmarks whose cycles follow from the machine table by construction (WMMA pipe rates
from LLVM's GFX125x schedule, the split wait counters, the tensor data mover's lines), and one
registry kernel timed end to end. They check the engine's wiring on gfx1250 instruction
streams, not the assumed figures."""
import pytest
import torch

from mxgemm import launcher, registry, toolchain
from mxgemm.emu import Emulator
from mxgemm.launcher import emulator_settings
from mxgemm.timing import MACHINES

ARCH = "gfx1250"
M = MACHINES["gfx1250-assumed"]


def _timed(src, kernel, args, block=32):
    emu = Emulator(arch=ARCH, race_check=False, timing="gfx1250-assumed")
    asm = toolchain.compile_hip_source('#include "mxgemm/device.h"\n' + src, ARCH)
    emu.launch(emu.load(asm), kernel, grid=(1, 1, 1), block=(block, 1, 1), args=args)
    return emu.last_timing


def _probe(t):
    """The simulated block at the kernel's ``probe`` label (the inline assembly under test)."""
    return next(b for b in t["breakdown"]["blocks"] if b["block"] == "probe")


def test_machine_is_labelled_assumed_and_refused_for_another_arch():
    assert M.arch == ARCH and M.wave_size == 32 and M.waves_per_simd == 16 and M.regs_per_simd_lane == 1024
    assert M.assumed and not MACHINES["mi355x"].assumed
    with pytest.raises(ValueError, match=r"machine 'gfx1250 \(assumed MI450-class\)' times gfx1250 launches, not gfx950"):
        Emulator(arch="gfx950", timing="gfx1250-assumed")
    with pytest.raises(ValueError, match="machine 'MI355X' times gfx950 launches, not gfx1250"):
        Emulator(arch=ARCH, timing="mi355x")


# LLVM's GFX125x schedule: a 2-pass XDL op holds the pipe 8 cycles, a 4-pass one 16; the 16x16x128
# f8f6f4 form is 4-pass when an operand is FP8 (the default format), 2-pass on FP4 x FP4.
@pytest.mark.parametrize("op,cycles", [
    ("v_wmma_f32_16x16x32_bf16 {d}, v[0:7], v[8:15], {d}", 8),
    ("v_wmma_f32_16x16x128_f8f6f4 {d}, v[0:15], v[16:31], {d}", 16),
    ("v_wmma_f32_16x16x128_f8f6f4 {d}, v[0:7], v[8:15], {d} matrix_a_fmt:MATRIX_FMT_FP4 matrix_b_fmt:MATRIX_FMT_FP4", 8),
], ids=["bf16", "fp8", "fp4"])
def test_independent_wmmas_issue_at_the_matrix_pipe_rate(op, cycles):
    n = 16
    body = "\\n".join(op.format(d=f"v[{32 + 8 * i}:{39 + 8 * i}]") for i in range(n))
    clobbers = ", ".join(f'"v{i}"' for i in range(32 + 8 * n))
    src = (r'''
MXGEMM_KERNEL(wmmas)(int* out) {
  asm volatile("probe:\n%BODY%" ::: %CLOB%);
}''').replace("%BODY%", body).replace("%CLOB%", clobbers)
    t = _timed(src, "wmmas", [torch.zeros(1, dtype=torch.int32)])
    pipe = n * cycles
    assert t["machine_assumed"] is True
    assert pipe <= t["cycles"] <= pipe + 100, (t["cycles"], pipe)
    # the wave issues a WMMA every 4 cycles but waits for the pipe: cycles - 4 before each but the first
    assert _probe(t)["stalls"]["mfma"] == (n - 1) * (cycles - M.simds)


def test_valu_is_issue_bound_on_wave32():
    """One wave32's independent adds: the VALU is held ``valu_cycles`` (1, LLVM) each, so the wave
    issues one per opportunity (every ``simds`` cycles) and never stalls on the pipe."""
    n = 64
    body = "\\n".join(f"v_add_nc_u32 v{1 + i % 8}, v0, v0" for i in range(n))
    src = (r'''
MXGEMM_KERNEL(adds)(int* out) {
  asm volatile("probe:\n%BODY%" ::: "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8");
}''').replace("%BODY%", body)
    t = _timed(src, "adds", [torch.zeros(1, dtype=torch.int32)])
    b = _probe(t)
    assert b["issued"] == n and "valu" not in b["stalls"]
    assert n * M.simds <= t["cycles"] <= n * M.simds + 100, t["cycles"]


@pytest.mark.parametrize("stride", [0, 4096])
def test_dependent_loads_cost_their_level_latency(stride):
    """A wave chases a pointer 32 times with global_load_b32 + s_wait_loadcnt: within one line
    (the first load misses to HBM, the rest hit the L1) or to a new line each hop."""
    hops = 32
    chain = "\\n".join(["global_load_b32 v1, v1, %0\\n s_wait_loadcnt 0x0"] * hops)
    src = (r'''
MXGEMM_KERNEL(chase)(const int* __restrict__ x) {
  asm volatile("v_mov_b32 v1, 0\nprobe:\n%CHAIN%" :: "s"(x) : "memory", "v1");
}''').replace("%CHAIN%", chain)
    x = torch.zeros(hops * stride // 4 + 64, dtype=torch.int32)
    for i in range(hops):
        x[i * stride // 4] = (i + 1) * stride
    t = _timed(src, "chase", [x])
    misses = hops if stride else 1
    lat = (hops - misses) * M.l1_latency + misses * M.hbm_latency
    # each wait issues one opportunity after its load
    assert lat - hops * M.simds <= _probe(t)["stalls"]["wait"] <= lat + hops * 40, (t["breakdown"]["stalls"], lat)
    assert t["breakdown"]["bytes"]["hbm"] == misses * M.line_bytes


# An HBM load (v2 = 0) and an LDS load are both in flight; the probe waits on one counter.
_SPLIT = r'''
MXGEMM_KERNEL(split)(int* __restrict__ x) {
  __shared__ int t[64];
  asm volatile("v_mov_b32 v2, 0\nprobe:\n%OPS%\ns_wait_%CNT% 0x0\ns_endpgm"
               :: "s"(x), "v"((unsigned)(unsigned long)(__attribute__((address_space(3))) int*)t)
               : "memory", "v1", "v2", "v3");
}'''


@pytest.mark.parametrize("ops,cnt,level", [
    ("global_load_b32 v1, v2, %0\\nds_load_b32 v3, %1", "dscnt", "lds"),
    ("global_load_b32 v1, v2, %0\\nds_load_b32 v3, %1", "loadcnt", "hbm"),
    ("global_store_b32 v2, v2, %0\\nds_load_b32 v3, %1", "loadcnt", None),
    ("global_store_b32 v2, v2, %0\\nds_load_b32 v3, %1", "storecnt", "l2"),
    ("global_load_b32 v1, v2, %0\\nds_load_b32 v3, %1", "loadcnt_dscnt", "hbm"),
], ids=["dscnt-lds", "loadcnt-load", "loadcnt-store", "storecnt-store", "loadcnt_dscnt-both"])
def test_split_counters_wait_for_their_own_operations(ops, cnt, level):
    """s_wait_dscnt waits for the LDS load only, s_wait_loadcnt for the global load only (a store
    is not a load), s_wait_storecnt for the store (taken by the L2), the combined form for both."""
    t = _timed(_SPLIT.replace("%OPS%", ops).replace("%CNT%", cnt), "split", [torch.zeros(64, dtype=torch.int32)])
    wait = _probe(t)["stalls"].get("wait", 0.0)
    lat = {"lds": M.lds_latency, "hbm": M.hbm_latency, "l2": M.l2_latency, None: 0}[level]
    assert max(0, lat - 2 * M.simds) <= wait <= lat + 30, (wait, lat)


_TDM = r'''
typedef int v4i __attribute__((ext_vector_type(4)));
typedef int v8i __attribute__((ext_vector_type(8)));
MXGEMM_KERNEL(tdm)(const float* x) {
  __shared__ float t[ROWS * COLS];
  const unsigned lds = (unsigned)(unsigned long)(__attribute__((address_space(3))) float*)t;
  unsigned long ga = (unsigned long)x;
  v4i g0 = {1, (int)lds, (int)ga, (int)((ga >> 32) | 0x80000000u)};
  v8i g1 = {2 << 16, COLS << 16, ROWS << 16, COLS << 16, ROWS, LD, 0, 0};   // fp32, ROWS x COLS, row stride LD
  __builtin_amdgcn_tensor_load_to_lds_d2(g0, g1, 0);
  __builtin_amdgcn_s_wait_tensorcnt(0);
}'''


def test_tensor_load_lines_reach_the_memory_levels():
    """One tensor_load_to_lds of 8 rows x 64 fp32 (256 bytes, two lines a row) 4 KiB apart:
    16 lines through L2, MALL and HBM (cold caches); s_wait_tensorcnt waits for HBM and the
    LDS write."""
    rows, cols, ld = 8, 64, 1024
    src = _TDM.replace("ROWS", str(rows)).replace("COLS", str(cols)).replace("LD", str(ld))
    t = _timed(src, "tdm", [torch.zeros(rows * ld, dtype=torch.float32)])
    lines = rows * cols * 4 // M.line_bytes
    assert t["breakdown"]["bytes"] == {lvl: lines * M.line_bytes for lvl in ("l2", "mall", "hbm")}
    wait = t["breakdown"]["stalls"]["wait"]
    assert M.hbm_latency + M.lds_latency <= wait + 2 * M.simds, t["breakdown"]["stalls"]
    assert t["cycles"] >= M.hbm_latency + M.lds_latency + lines * M.line_bytes / M.l1_bytes_per_clk - 4 * M.simds


def test_mx_gemm_gfx1250_timed_end_to_end():
    """A registered mx_gemm gfx1250 variant (e4m3 x e4m3, 128 x 128 tiles, TDM loads) at 128 x 128
    x 256 through the launcher: one workgroup, so the launch is latency-bound; its matrix pipe
    was busy 16 cycles (LLVM: an FP8 operand makes the scaled 16x16x128 WMMA 4-pass) for each of
    its 8 x 8 x 2 WMMAs; the A and B tiles and their scales come from HBM (TDM loads)."""
    from test_mx_gemm import operand
    kernel = registry.get("mx_gemm")
    v = next(v for v in kernel.variants_for(ARCH) if v["A_FMT"] == v["B_FMT"] == "e4m3" and v["BM"] == 128
             and v["SCALE_PATH"] == "tdm" and not v["B_STREAMING"] and v["CLUSTER_M"] * v["CLUSTER_N"] == 1
             and not v["SPLITK"])
    m = n = 128
    k = 256
    g = torch.Generator().manual_seed(0)
    a, sa = operand(m, k, "e4m3", g)
    b, sb = operand(n, k, "e4m3", g)
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    with emulator_settings(race_check=False, timing="gfx1250-assumed"):
        launcher.launch_variant(kernel.name, v, ARCH, "emu", writes=(out,), a=a, a_scale=sa, b=b, b_scale=sb,
                                out=out, M=m, N=n, K=k, splits=1)
        (_, t), = launcher.timings()
    assert t["machine_assumed"] is True and t["limiter"] == "latency" and t["sampled"] is False
    busy = t["breakdown"]["busy"]
    span = t["cycles"] * M.simds * M.cus // M.xcds
    assert busy["mfma"] * span == pytest.approx(8 * 8 * 2 * 16)
    # HBM: every line of A, B, their e8m0 scales (k / 32 bytes a row) and the bf16 output, once
    assert t["breakdown"]["bytes"]["hbm"] == (m + n) * k + (m + n) * k // 32 + m * n * 2
    assert t["cycles"] > M.hbm_latency and t["breakdown"]["stalls"]["wait"] > 0
