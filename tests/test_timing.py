"""The timing model's engine on microbenchmarks built to isolate one mechanism each: their
predicted cycles follow from the machine table (python/mxgemm/timing/machine.py) by
construction, so these check the engine's wiring (issue, pipes, waits, caches, sampling), not
the table's calibration (python -m mxgemm.timing calibrate; docs/timing_model.md)."""
import pytest
import torch
from mxgemm import calibration, isa, toolchain
from mxgemm.emu import Emulator
from mxgemm.timing import MACHINES, xcd0_sample

M = MACHINES["mi355x"]
MFMA = "v_mfma_scale_f32_16x16x128_f8f6f4 v[{d}:{e}], v[0:7], v[8:15], 0, v40, v40"


def _timed(src, kernel, args):
    emu = Emulator(arch="gfx950", race_check=False, timing="mi355x")
    asm = toolchain.compile_hip_source('#include "mxgemm/device.h"\n' + src)
    emu.launch(emu.load(asm), kernel, grid=(1, 1, 1), block=(64, 1, 1), args=args)
    return emu.last_timing


def test_independent_mfmas_issue_at_the_matrix_pipe_rate():
    n = 16
    body = "\\n".join(MFMA.format(d=16 + 4 * i, e=19 + 4 * i) for i in range(n))
    clobbers = ", ".join(f'"v{i}"' for i in range(16, 16 + 4 * n))
    src = (r'''
MXGEMM_KERNEL(mfmas)(int* out) {
  asm volatile("v_mov_b32 v40, 127\n%BODY%" ::: %CLOB%, "v40");
}''').replace("%BODY%", body).replace("%CLOB%", clobbers)
    t = _timed(src, "mfmas", [torch.zeros(1, dtype=torch.int32)])
    pipe = n * isa.mfma_cycles(MFMA.format(d=16, e=19))
    assert pipe <= t["cycles"] <= pipe + 100, (t["cycles"], pipe)


@pytest.mark.parametrize("stride", [0, 4096])
def test_dependent_loads_cost_their_level_latency(stride):
    """A wave chases a pointer 32 times with global_load_dword: within one line (the first load
    misses to HBM, the rest hit the L1) or to a new line each hop (every load misses)."""
    hops = 32
    chain = "\\n".join(["global_load_dword v1, v1, %0\\n s_waitcnt vmcnt(0)"] * hops)
    src = (r'''
MXGEMM_KERNEL(chase)(const int* __restrict__ x) {
  asm volatile("v_mov_b32 v1, 0\n%CHAIN%" :: "s"(x) : "memory", "v1");
}''').replace("%CHAIN%", chain)
    x = torch.zeros(hops * stride // 4 + 64, dtype=torch.int32)
    for i in range(hops):
        x[i * stride // 4] = (i + 1) * stride
    t = _timed(src, "chase", [x])
    misses = hops if stride else 1
    lat = (hops - misses) * M.l1_latency + misses * M.hbm_latency   # latencies are load-to-use, per level
    assert lat <= t["cycles"] <= lat + hops * 40 + 300, (t["cycles"], lat)
    assert t["breakdown"]["bytes"]["hbm"] == misses * M.line_bytes


def test_sampled_run_agrees_with_the_full_run():
    """On a machine of 2 CUs per XCD, a 2048 x 2048 x 128 GEMM of 128 x 128 tiles gives XCD 0 32
    workgroups: 8 rounds of 2 CUs x 2 resident. Timed from all 32, and from the first 2 rounds
    extrapolated."""
    import dataclasses

    from mxgemm.timing import engine
    small = dataclasses.replace(M, cus=16)
    stage = calibration.STAGES["fp8_gemm_128x128_8wave"]
    n, k = 2048, 128
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)
    grid = (n // 128, n // 128, 1)
    prog = Emulator(arch="gfx950").load(calibration.assembly())
    meta = prog.kernel_meta(stage.symbol)
    assert engine.occupancy(small, meta, 8, meta.group_segment_fixed_size) == 2
    times = []
    for count in (32, 8):
        emu = Emulator(arch="gfx950", race_check=False, timing=small)
        c = torch.zeros(n, n, dtype=torch.bfloat16)
        emu.launch(emu.load(calibration.assembly()), stage.symbol, grid=grid, block=(*stage.block, 1),
                   args=[a, b, c, n, n, k], workgroups=xcd0_sample(grid, count, small))
        times.append(emu.last_timing)
    whole, sampled = times
    assert whole["breakdown"]["workgroups_simulated"] == 32 and sampled["breakdown"]["workgroups_simulated"] == 8
    assert sampled["us"] == pytest.approx(whole["us"], rel=0.10)


def test_timing_off_records_nothing():
    emu = Emulator(arch="gfx950")
    assert emu.timing is None and emu.last_timing is None and emu.lockstep


def test_an_op_call_is_timed_through_emulator_settings():
    """Every launch of a public op in the block is timed; its result is unchanged."""
    import mxgemm
    from mxgemm import launcher
    x, s = mxgemm.quant.quantize_mx(torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)), "e4m3")
    want = mxgemm.mxfp8_dequantize(x, s)
    with launcher.emulator_settings(timing="mi355x"):
        got = mxgemm.mxfp8_dequantize(x, s)
        (symbol, t), = launcher.timings()
    assert torch.equal(got, want) and symbol == "mxfp8_dequant"
    assert t["us"] > 0 and not t["sampled"] and set(t) >= {"us", "cycles", "clock_ghz", "limiter", "breakdown"}
    assert launcher.timings() == []


def test_cycles_are_attributed_to_the_block_that_waited():
    """A loop of dependent loads: its block holds the wait cycles (every hop misses to HBM), the
    entry block almost none."""
    src = r'''
MXGEMM_KERNEL(chase_loop)(const int* __restrict__ x, int* out, int hops, int zero) {
  int p = mxgemm::thread_x() * zero;   // a vector load chain (a uniform one would be scalar loads)
  for (int i = 0; i < hops; ++i) p = __builtin_nontemporal_load(x + p);
  if (mxgemm::thread_x() == 0) out[0] = p;
}'''
    hops, stride = 16, 1024
    x = torch.zeros(hops * stride, dtype=torch.int32)
    for i in range(hops):
        x[i * stride] = (i + 1) * stride
    t = _timed(src, "chase_loop", [x, torch.zeros(1, dtype=torch.int32), hops, 0])
    blocks = t["breakdown"]["blocks"]
    hot = blocks[0]
    assert hot["block"] != "entry" and hot["issued"] >= hops
    loop_wait = sum(b["stalls"].get("wait", 0) for b in blocks if b["block"] != "entry")
    assert hops * (M.hbm_latency - 60) <= loop_wait <= hops * M.hbm_latency, blocks
    assert hot["stalls"]["wait"] >= (hops - 2) * (M.hbm_latency - 60)
    entry = [b for b in blocks if b["block"] == "entry"][0]
    assert entry["stalls"].get("wait", 0) < 2 * M.hbm_latency


def test_sampled_op_launches_run_only_xcd0s_first_rounds():
    import mxgemm
    from mxgemm import launcher
    x, s = mxgemm.quant.quantize_mx(torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0)), "e4m3")
    with launcher.emulator_settings(timing="mi355x", timing_rounds=1):
        mxgemm.mxfp8_dequantize(x, s)
        (_, sampled), = launcher.timings()
    with launcher.emulator_settings(timing="mi355x"):
        mxgemm.mxfp8_dequantize(x, s)
        (_, whole), = launcher.timings()
    b = sampled["breakdown"]
    assert sampled["sampled"] and not whole["sampled"]
    assert b["workgroups_simulated"] == b["occupancy_workgroups_per_cu"] * M.cus // M.xcds < b["workgroups_per_xcd"]
    assert sampled["us"] == pytest.approx(whole["us"], rel=0.25)


def test_time_command_prints_the_hottest_blocks(capsys):
    from mxgemm.timing import cli
    assert cli.main(["mxfp8_dequant", "--preset", "dequant", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "mxfp8_dequant:" in out and "limiter" in out and "stalls (cycles)" in out
    assert cli.main(["no_such_kernel"]) == 1
