"""mx_gemm's gfx1250 variants executed on the gfx1250 emulator target in race mode.

Contract: bitwise, as on gfx950 (tests/test_mx_gemm.py): each scaled WMMA sums its 128-wide K
step exactly and rounds once to fp32, the steps add into an fp32 accumulator in K order, so
mxgemm.reference.mx_gemm_ref(chunk=128) models the kernel exactly, and the gfx950 instance of
the family (64 x 64 tiles, same formats and output) gives the same bits on the same inputs.
Shapes: a partial row and column tile (TDM zero fill past M and N; multicast variants: a whole
cluster of tiles, the last partial), NUM_BUFFERS + 1 K steps (the ring wraps and the last
prefetches are predicated off), split-K in two uneven splits. Race mode is shown to bite:
deleting the ring's tensor wait or the workgroup barriers raises RaceError.
Multicast variants (CLUSTER_M x CLUSTER_N > 1) run as cluster launches (the grid rounded up to
whole clusters): their TDM loads write every workgroup of the mask, the cluster barrier waits
for every workgroup; a wrong multicast mask gives wrong tiles. Not caught: a missing cluster
barrier (the emulator runs a cluster's workgroups one after another between cluster barriers,
and writes into a peer's LDS are not race-tracked).
"""
import pytest
import torch
from test_mx_gemm import OUT, operand

import mxgemm
from mxgemm import build, launcher, reference, registry
from mxgemm.emu import RaceError
from mxgemm.launcher import emulator_settings

KERNEL = registry.get("mx_gemm")
ARCH = "gfx1250"
VARIANTS = KERNEL.variants_for(ARCH)


def launch(v, a, sa, b, sb, K, splits):
    M, N = a.shape[0], b.shape[0]
    out = torch.zeros(M, N, dtype=OUT[v["OUT"]])
    launcher.launch_variant(KERNEL.name, v, ARCH, "emu", writes=(out,), a=a, a_scale=sa, b=b, b_scale=sb, out=out,
                            M=M, N=N, K=K, splits=splits)
    return out


def inputs(v, seed):
    """A partial tile in both directions (67 x 96), or in the last workgroup of a whole cluster."""
    M, N = (v["BM"] * v["CLUSTER_M"] - 5, v["BN"] * v["CLUSTER_N"] - 32) if v["CLUSTER_M"] * v["CLUSTER_N"] > 1 \
        else (67, 96)
    splits = 2 if v["SPLITK"] else 1
    K = 128 * (v["NUM_BUFFERS"] + 1)
    g = torch.Generator().manual_seed(seed)
    a, sa = operand(M, K, v["A_FMT"], g)
    b, sb = operand(N, K, v["B_FMT"], g)
    return a, sa, b, sb, K, splits


@pytest.mark.parametrize("v", VARIANTS, ids=registry.variant_id)
def test_variant_bitwise_vs_reference_and_gfx950(v):
    a, sa, b, sb, K, splits = inputs(v, seed=11)
    got = launch(v, a, sa, b, sb, K, splits)
    ref = reference.mx_gemm_ref(a, sa, b, sb, v["A_FMT"], v["B_FMT"], OUT[v["OUT"]], chunk=reference.MX_MMA_K,
                                splits=splits)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    gfx950 = mxgemm.mx_gemm(a, sa, b, sb, a_format=v["A_FMT"], b_format=v["B_FMT"], out_dtype=OUT[v["OUT"]],
                            config={"BM": 64, "BN": 64, "SPLITS": splits})
    assert torch.equal(got.view(torch.uint8), gfx950.view(torch.uint8))


@pytest.mark.parametrize("v", [VARIANTS[0], next(v for v in VARIANTS if v["SCALE_PATH"] == "buffer_lds_stage")],
                         ids=lambda v: v["SCALE_PATH"])
@pytest.mark.parametrize("sync", ["pipeline_wait", "barrier"])
def test_deleted_sync_raises(v, sync):
    """Race mode sees these kernels' synchronisation: without the ring's s_wait_tensorcnt
    NUM_BUFFERS-2, or without the workgroup barriers, an LDS read races a TDM load or another
    wave's scale-word store."""
    what = {"pipeline_wait": {f"s_wait_tensorcnt {v['NUM_BUFFERS'] - 2:#x}"},
            "barrier": {"s_barrier_signal -1", "s_barrier_wait -1"}}[sync]

    def delete(asm):
        return "\n".join("\t; deleted" if l.strip() in what else l for l in asm.splitlines()) + "\n"

    with emulator_settings(asm_edit=delete), pytest.raises(RaceError, match="LDS race"):
        launch(v, *inputs(v, seed=0))


def test_launch_with_another_workgroup_size_is_refused():
    """The kernel is compiled for 4 wave32 waves (metadata .reqd_workgroup_size 128); a launch
    with gfx950's 256 threads would run 4 waves past the tile, whose scale words land on other
    rows' LDS and past the allocation: the emulator refuses the launch."""
    v = VARIANTS[0]
    a, sa, b, sb, K, splits = inputs(v, seed=0)
    M, N = a.shape[0], b.shape[0]
    out = torch.zeros(M, N, dtype=OUT[v["OUT"]])
    args = dict(a=a, a_scale=sa, b=b, b_scale=sb, out=out, M=M, N=N, K=K, splits=splits)
    with pytest.raises(ValueError, match=r"requires workgroup size \(128, 1, 1\); launched with block \(256, 1, 1\)"):
        launcher.launch(build.artifact(KERNEL.name, v, ARCH), KERNEL.launch_grid(v, M=M, N=N, splits=splits), (256,),
                        [args[x] for x in KERNEL.args], "emu")


def test_cluster_barrier_needs_every_workgroup_to_signal():
    """Without its s_barrier_signal -3 no workgroup arrives at the cluster barrier: RaceError."""
    v = next(v for v in VARIANTS if v["CLUSTER_M"] * v["CLUSTER_N"] > 1)

    def delete(asm):
        return "\n".join("\t; deleted" if l.strip() == "s_barrier_signal -3" else l for l in asm.splitlines()) + "\n"

    with emulator_settings(asm_edit=delete), pytest.raises(RaceError, match="cluster barrier never completes"):
        launch(v, *inputs(v, seed=0))


@pytest.mark.parametrize("a_fmt,b_fmt,out", [("e4m3", "e4m3", "bf16"), ("e4m3", "e2m1", "bf16"),
                                             ("e2m1", "e2m1", "bf16")])
def test_op_plans_and_runs_gfx1250_variants(monkeypatch, a_fmt, b_fmt, out):
    """mxgemm.mx_gemm on the gfx1250 emulator (MXGEMM_EMU_ARCH): the planner chooses among the
    gfx1250 variants (the first registered of the chosen tile: no cluster variant) and the op
    returns the reference's bits; a format pair with no gfx1250 variant is a GuardError [arch]."""
    monkeypatch.setattr(launcher, "EMU_ARCH", ARCH)
    mxgemm.mx_gemm.clear_plans()
    g = torch.Generator().manual_seed(5)
    M, N, K = 70, 96, 256
    a, sa = operand(M, K, a_fmt, g)
    b, sb = operand(N, K, b_fmt, g)
    kw = dict(a_format=a_fmt, b_format=b_fmt, out_dtype=OUT[out])
    plan = mxgemm.explain("mx_gemm", a, sa, b, sb, **kw)
    assert plan.arch == ARCH and plan.variant in VARIANTS and plan.block == (128, 1, 1)
    assert plan.variant["CLUSTER_M"] * plan.variant["CLUSTER_N"] == 1
    got = mxgemm.mx_gemm(a, sa, b, sb, **kw)
    ref = reference.mx_gemm_ref(a, sa, b, sb, a_fmt, b_fmt, OUT[out], chunk=reference.MX_MMA_K)
    assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    mxgemm.mx_gemm.clear_plans()
    if out == "bf16" and a_fmt == b_fmt == "e4m3":
        from mxgemm.guards import GuardError
        (c, sc), (d, sd) = operand(M, K, "e2m3", g), operand(N, K, "e2m3", g)
        with pytest.raises(GuardError, match=r"\[arch\] no gfx1250 mx_gemm variant for e2m3 x e2m3 -> bf16"):
            mxgemm.mx_gemm(c, sc, d, sd, a_format="e2m3", b_format="e2m3")
