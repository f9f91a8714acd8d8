"""The timing model's engine on microbenchmarks built to isolate one mechanism each: their
predicted cycles follow from the machine table (python/mxgemm/timing/machine.py) by
construction, so these check the engine's wiring (issue, pipes, waits, caches, sampling), not
the table's calibration (python -m mxgemm.timing calibrate; docs/timing_model.md)."""
import pathlib
import subprocess

import pytest
import torch

from mxgemm import asm_facts, calibration, toolchain
from mxgemm.emu import Emulator
from mxgemm.timing import MACHINES, xcd0_sample

M = MACHINES["mi355x"]
MFMA = "v_mfma_scale_f32_16x16x128_f8f6f4 v[{d}:{e}], v[0:7], v[8:15], 0, v40, v40"


def _timed(src, kernel, args, grid=(1, 1, 1), block=(64, 1, 1), workgroups=None):
    emu = Emulator(arch="gfx950", race_check=False, timing="mi355x")
    asm = toolchain.compile_hip_source('#include "mxgemm/device.h"\n' + src)
    emu.launch(emu.load(asm), kernel, grid=grid, block=block, args=args, workgroups=workgroups)
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
    pipe = n * asm_facts.mfma_cycles(MFMA.format(d=16, e=19))
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
    assert cli.main(["--preset", "dequant", "--rounds", "1"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["mxfp8_dequant", "mxfp8_dequant_flydsl"]


def test_the_triton_peer_is_timed_on_the_same_model_and_computes_the_same_product():
    """Triton's tl.dot_scaled linear kernel (mxgemm.timing.peers.smallm), compiled for gfx950, beside
    smallm_mxfp8_gemm on one decode shape."""
    import mxgemm
    from mxgemm import reference
    from mxgemm.quant import quantize_mx
    from mxgemm.timing.peers import smallm, time_ours
    g = torch.Generator().manual_seed(0)
    (a, sa), (b, sb) = quantize_mx(torch.randn(3, 512, generator=g), "e4m3"), \
        quantize_mx(torch.randn(256, 512, generator=g), "e4m3")
    theirs, t = smallm.time_peer(a, sa, b, sb)
    mine, us, symbol, _ = time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb))
    want = reference.mx_gemm_ref(a, sa, b, sb, "e4m3", "e4m3", torch.bfloat16)
    torch.testing.assert_close(theirs.float(), want.float(), rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(mine.float(), want.float(), rtol=2 ** -7, atol=1e-2)
    assert t["us"] > 0 and us > 0 and symbol.startswith("smallm_mxfp8")
    assert t["breakdown"]["workgroups_simulated"] == 1     # grid (1, 2): XCD 0 holds workgroup 0


def test_streaming_reads_reach_the_achievable_hbm_bandwidth():
    """64 MiB read once with 16-byte loads by 2048 workgroups (XCD 0's 256 simulated): the chip's
    bandwidth comes out within 10 % of the table's achievable HBM bandwidth (80 % of 8 TB/s, what
    published memory-bound MI355X kernels reach)."""
    src = r'''
typedef unsigned u32x4 __attribute__((ext_vector_type(4)));
MXGEMM_KERNEL(stream)(const u32x4* __restrict__ x, unsigned* out, int n, int stride) {
  unsigned s = 0;
  for (int i = mxgemm::block_x() * 256 + mxgemm::thread_x(); i < n; i += stride) {
    const u32x4 v = x[i];
    s += v[0] ^ v[1] ^ v[2] ^ v[3];
  }
  if (s == 0x12345678u) out[0] = s;   // keeps the loads; never true for zeros
}'''
    nbytes, grid = 64 << 20, (2048, 1, 1)
    x = torch.zeros(nbytes // 4, dtype=torch.int32)
    t = _timed(src, "stream", [x, torch.zeros(1, dtype=torch.int32), nbytes // 16, grid[0] * 256], grid=grid, block=(256, 1, 1),
               workgroups=xcd0_sample(grid, 256))
    tbps = nbytes / (t["us"] * 1e-6) / 1e12
    assert tbps == pytest.approx(M.hbm_bytes_per_s / 1e12, rel=0.10), t
    assert t["limiter"] == "hbm"


@pytest.mark.parametrize("stride, phase_cycles", [(16, 1), (128, 8)])
def test_lds_reads_cost_their_bank_conflicts(stride, phase_cycles):
    """Four waves issue 32 ds_read_b128 each at lane * stride bytes: 16 B apart every phase is
    conflict free (4 cycles an instruction: 256 B/clk); 128 B apart, 8 lanes of a phase share
    their banks (32 cycles)."""
    reads = "\\n".join(["ds_read_b128 v[4:7], %0"] * 32)
    src = (r'''
MXGEMM_KERNEL(lds_reads)(int* out, int stride) {
  __shared__ int buf[4096];
  buf[mxgemm::thread_x()] = 0;
  mxgemm::syncthreads();
  const unsigned addr = mxgemm::thread_x() % 64 * stride;
  asm volatile("%READS%\n s_waitcnt lgkmcnt(0)" :: "v"(addr) : "v4", "v5", "v6", "v7", "memory");
  if (stride < 0) out[0] = buf[1];
}''').replace("%READS%", reads)
    t = _timed(src, "lds_reads", [torch.zeros(1, dtype=torch.int32), stride], block=(256, 1, 1))
    pipe = 4 * 32 * 4 * phase_cycles
    assert pipe <= t["cycles"] <= pipe + M.lds_latency + 300, (t["cycles"], pipe)


def test_timing_does_not_depend_on_where_the_host_buffers_lie():
    """The same launch on copies of its inputs (host tensors lie 64-byte aligned, anywhere in a
    128-byte line; GPU allocations are line aligned) gives the same cycles every time."""
    import mxgemm
    from mxgemm import launcher
    x, s = mxgemm.quant.quantize_mx(torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)), "e4m3")
    cycles, offsets = set(), set()
    keep = []
    for _ in range(6):
        xs, ss = x.clone(), s.clone()
        keep.append((xs, ss, torch.empty(64, dtype=torch.uint8)))   # shifts the next allocations
        offsets.add(xs.data_ptr() % 128)
        with launcher.emulator_settings(timing="mi355x"):
            mxgemm.mxfp8_dequantize(xs, ss)
            cycles.add(launcher.timings()[0][1]["cycles"])
    assert len(cycles) == 1, (cycles, offsets)


def test_a_barrier_releases_its_waves_after_the_tables_latency():
    """Four waves on four SIMDs pass 32 s_barriers back to back: each round trip is the table's
    barrier latency (the last arrival to the release of all), nothing else in between."""
    n = 32
    src = (r'''
MXGEMM_KERNEL(barriers)(int* out) {
  asm volatile("%BODY%" ::: "memory");
}''').replace("%BODY%", "\\n".join(["s_barrier"] * n))
    t = _timed(src, "barriers", [torch.zeros(1, dtype=torch.int32)], block=(256, 1, 1))
    trip = n * M.barrier_latency
    assert trip <= t["cycles"] <= trip + 2 * n + 50, (t["cycles"], trip)
    assert t["breakdown"]["stalls"]["barrier"] >= 4 * (n - 1) * (M.barrier_latency - 1)


@pytest.mark.parametrize("op, value", [("global_atomic_add_f32", 1.0), ("global_atomic_add", 1)])
@pytest.mark.parametrize("pattern", ["same", "coalesced", "spread"])
def test_atomics_cost_their_l2_channel_or_l1_port(op, value, pattern):
    """One wave issues 32 global atomic adds (no return), its 64 lanes on one address (one line:
    its channel applies 64 lane operations per instruction), on 64 consecutive dwords (two lines
    on two channels, 32 operations each) or 128 bytes apart (64 lines: the CU's L1 port passes
    them at its rate, each channel takes only 4). The time is the table's rate of the unit that
    binds (the first access's miss to HBM overlaps the queue), and the sums are right."""
    n = 32
    offset = {"same": "0", "coalesced": "mxgemm::thread_x() * 4", "spread": "mxgemm::thread_x() * 128"}[pattern]
    vtype = "float" if isinstance(value, float) else "int"
    src = (r'''
MXGEMM_KERNEL(atomics)(%T%* x) {
  const unsigned off = %OFF%;
  const %T% one = 1;
  asm volatile("%BODY%\n s_waitcnt vmcnt(0)" :: "v"(off), "v"(one), "s"(x) : "memory");
}''').replace("%OFF%", offset).replace("%T%", vtype).replace("%BODY%", "\\n".join([f"{op} %0, %1, %2"] * n))
    x = torch.zeros(64 * 32, dtype=torch.float32 if vtype == "float" else torch.int32)
    t = _timed(src, "atomics", [x])
    xfer = M.line_bytes * M.l2_channels / M.l2_bytes_per_clk
    lanes_per_line, lines = {"same": (64, 1), "coalesced": (32, 2), "spread": (1, 64)}[pattern]
    channel = n * (xfer + lanes_per_line * M.atomic_cycles)
    port = n * lines * M.line_bytes / M.l1_bytes_per_clk
    rate = max(channel, port)
    assert rate <= t["cycles"] <= rate + M.hbm_latency + 200, (t["cycles"], channel, port)
    got = x.view(64, 32)[:, 0] if pattern == "spread" else x[:64] if pattern == "coalesced" else x[:1] / 64
    assert torch.all(got == n), got


def test_the_model_applies_packed_bf16_atomics_as_fast_as_hardware_did():
    """docs/timing_model.md §2, "L2 atomics": aiter's FlyDSL MoE stage-2 kernel added 16384 tokens x
    top-16 x 3584 columns with packed bf16 atomics in 1500.59 us on gfx950 (its tuned table), its
    GEMM included. The model's ceiling for that traffic (whole lines of 32 packed lanes on every
    channel, at the loaded clock) must not be below that."""
    hardware = 16384 * 16 * 3584 / 1500.59e-6
    per_line = M.line_bytes * M.l2_channels / M.l2_bytes_per_clk + 32 * M.atomic_cycles
    ceiling = 64 / per_line * M.l2_channels * M.xcds * M.loaded_clock_ghz * 1e9
    assert ceiling >= hardware, (ceiling, hardware)


def test_stratified_rounds_time_a_grid_whose_tail_is_idle():
    """A grid whose second half exits at once (a padded tail), on a machine of 2 CUs per XCD
    holding 4 workgroups each: XCD 0's 64 workgroups are 8 rounds, the first 4 busy. The first
    round and one from each of 2 strata (rounds 0, 1, 4) give the whole share's time; XCD 0's
    first 3 rounds, all busy, stand for 8 busy rounds and double it."""
    import dataclasses

    from mxgemm.timing import rounds_sample
    small = dataclasses.replace(M, cus=16)
    src = r'''
MXGEMM_KERNEL(tail)(unsigned* out, int busy, int iters) {
  __shared__ unsigned pad[10240];   // 40 KiB: 4 workgroups per CU
  if ((int)mxgemm::block_x() >= busy) return;
  unsigned s = mxgemm::thread_x();
  for (int i = 0; i < iters; ++i) s = s * 2654435761u + 1u;
  pad[mxgemm::thread_x()] = s;
  mxgemm::syncthreads();
  if (pad[(mxgemm::thread_x() + 1) % 64] == 0x12345678u) out[0] = s;
}'''
    asm = toolchain.compile_hip_source('#include "mxgemm/device.h"\n' + src)
    grid, block = (512, 1, 1), (64, 1, 1)
    prog = Emulator(arch="gfx950").load(asm)
    strata = rounds_sample(small, prog, "tail", grid, block, 0, 3)
    firsts = xcd0_sample(grid, 24, small)
    assert len(strata) == 24 and [i // 8 for i, _, _ in strata][::8] == [0, 8, 32]   # rounds 0, 1, 4
    times = {}
    for name, wgs in (("whole", xcd0_sample(grid, 64, small)), ("strata", strata), ("firsts", firsts)):
        emu = Emulator(arch="gfx950", race_check=False, timing=small)
        emu.launch(emu.load(asm), "tail", grid=grid, block=block, args=[torch.zeros(1, dtype=torch.int32), 256, 200],
                   workgroups=wgs)
        times[name] = emu.last_timing["cycles"]
    assert times["strata"] == pytest.approx(times["whole"], rel=0.10), times
    assert times["firsts"] > 1.6 * times["whole"], times


@pytest.mark.parametrize("op, multi", [("global_load_ubyte", False), ("global_load_dword", False),
                                       ("global_load_dwordx4", True)])
def test_vector_loads_pass_the_address_unit_at_its_rate(op, multi):
    """One wave loads a line from HBM and waits, then issues 128 loads whose 64 lanes all read
    that line (L1 hits): the L1 port passes each in one line's time, so the CU's address unit
    binds, at the table's cycles per wave64 instruction (more for a multi-dword access)."""
    n = 128
    dst = "v[4:7]" if multi else "v4"
    src = (r'''
MXGEMM_KERNEL(loads)(const int* __restrict__ x) {
  asm volatile("v_mov_b32 v1, 0\n global_load_dword v4, v1, %0\n s_waitcnt vmcnt(0)\n%BODY%\n s_waitcnt vmcnt(0)"
               :: "s"(x) : "memory", "v1", "v4", "v5", "v6", "v7");
}''').replace("%BODY%", "\\n".join([f"{op} {dst}, v1, %0"] * n))
    t = _timed(src, "loads", [torch.zeros(64, dtype=torch.int32)])
    rate = n * (M.ta_multi_cycles if multi else M.ta_cycles)
    assert rate > n * M.line_bytes / M.l1_bytes_per_clk       # the address unit, not the port, binds
    warm = M.hbm_latency + M.ta_cycles                              # the first load's miss, waited for
    assert warm + rate <= t["cycles"] <= warm + rate + M.l1_latency + 100, (t["cycles"], rate)
    assert t["breakdown"]["busy"]["ta"] > t["breakdown"]["busy"]["l1"]


def test_a_kernel_from_another_revision_runs_with_that_revisions_arguments():
    """mxgemm.timing.revisions: train_grouped_gemm before its strided scales took seven arguments
    fewer (its registry at that commit, when the clone has it, where it had its former name and
    file); the FlyDSL dequantise kernel built
    from HEAD (in every clone),
    launched with the argument names the op passes today, computes the op's result and is timed."""
    import mxgemm
    from mxgemm import registry, specs
    from mxgemm.timing import revisions
    repo = pathlib.Path(__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True)  # noqa: E731
    if git("cat-file", "-e", "6dfc569^{commit}").returncode == 0:   # absent from a shallow clone
        strides = ("sa_sg", "sa_si", "sa_sk", "sb_sg", "sb_sj", "sb_sk", "sb_shift")
        old = revisions.kernel_at("6dfc569", "train_grouped_gemm")
        assert old.args == tuple(a for a in registry.get("train_grouped_gemm").args if a not in strides)
        assert old.symbol == "grouped_gemm_fp8" and old.source.endswith("/grouped_gemm_fp8.py")
    head = git("rev-parse", "--short=7", "HEAD").stdout.strip()
    case = specs.Case("mxfp8_dequant_flydsl", {}, dict(M=64, K=256), "small")
    call = specs.op_call(case, fill="data")
    values, rows = revisions.time_revisions(call, [head], rounds=0)
    (c, t), = rows
    assert c.startswith(head) and t["cycles"] > 0 and not t["sampled"]
    x, s = call.args[:2]
    assert torch.equal(values["out"], mxgemm.mxfp8_dequantize(x, s))


@pytest.mark.parametrize("stage", ["fp8_gemm_vector_loads", "fp8_gemm_direct_to_lds"])
def test_dma_loads_bring_their_lines_from_memory(stage):
    """One 64 x 64 workgroup with K = 128 reads A and B once (64 + 64 lines of 128 bytes, all cold)
    and writes C (64 x 64 bf16: 64 lines): 192 lines reach HBM whether the operands come through
    registers or by global -> LDS DMA, whose LDS write must not hide the load's lines."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 128, generator=g).to(torch.float8_e4m3fn) for _ in range(2))
    emu = Emulator(arch="gfx950", race_check=False, timing="mi355x")
    calibration.launch(emu, emu.load(calibration.assembly()), calibration.STAGES[stage], a, b,
                       torch.zeros(64, 64, dtype=torch.bfloat16))
    assert emu.last_timing["breakdown"]["bytes"]["hbm"] == (64 + 64 + 64) * M.line_bytes


@pytest.mark.parametrize("waves", [1, 5])
def test_a_simd_issues_one_instruction_of_a_type_per_opportunity(waves):
    """Each SIMD gets an issue opportunity every 4 cycles; a wave issues at most one instruction
    per opportunity and a SIMD at most one scalar instruction per opportunity. One wave's 64
    scalar adds take 4 cycles each; with five waves, SIMD 0 holds two, whose 128 scalar adds
    share its scalar slot: 8 cycles per add of a wave."""
    n = 64
    src = (r'''
MXGEMM_KERNEL(salu)(int* out) {
  asm volatile("%BODY%" ::: "s10");
}''').replace("%BODY%", "\\n".join(["s_add_u32 s10, s10, 1"] * n))
    t = _timed(src, "salu", [torch.zeros(1, dtype=torch.int32)], block=(64 * waves, 1, 1))
    per_add = M.simds * (2 if waves > 1 else 1)
    assert n * per_add <= t["cycles"] <= n * per_add + 60, (t["cycles"], n * per_add)


def test_timing_xcd0_runs_only_xcd0s_workgroups_for_the_same_time():
    """timing_xcd0: the engine replays XCD 0 alone, so running only its share gives the whole grid's
    time; the other XCDs' output tiles stay unwritten."""
    import mxgemm
    from mxgemm.timing.peers import smallm, time_ours
    a, sa, b, sb = smallm.operands(1, 2048, 256)
    full, us, _, t = time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb), rounds=3)
    zeros = torch.zeros(1, 2048, dtype=torch.bfloat16)
    part, us0, _, t0 = time_ours(lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=zeros), rounds=3, xcd0=True)
    assert us0 == us and t0["breakdown"]["workgroups_simulated"] == t["breakdown"]["workgroups_simulated"]
    written = (part != 0).any(dim=0)
    assert 0 < written.sum() <= 2048 // 8 and torch.equal(part[:, written], full[:, written])
    assert (full != 0).all()


def test_every_peer_family_names_its_peer_and_cells():
    from mxgemm.timing import peers
    for name in peers.FAMILIES:
        fam = peers.family(name)
        cells = fam.cells()
        assert fam.PEER and cells and callable(fam.run), name
        assert len({c["label"] for c in cells}) == len(cells), name
    with pytest.raises(ValueError, match="unknown peer family 'nope'"):
        peers.family("nope")
