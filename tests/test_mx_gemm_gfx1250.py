"""mx_gemm on gfx1250: every registered gfx1250 variant compiles, and its assembly shows what the
variant promises (docs/gfx1250_isa.md). These are static checks; tests/emu/test_emu1250_mx_gemm.py
runs the variants on the gfx1250 emulator.

Per variant: wave32; zero spills and scratch; LDS within gfx1250's 320 KiB and equal to the
documented ring (NUM_BUFFERS stages of A and B rows padded by 16 bytes plus one scale word per
row); in the K loop: one scaled WMMA per 16 x 16 tile of the wave with the operand formats of the
variant (F4_WIDE: one v_wmma_scale_f32_32x16x128_f4 per two B tiles), one Tensor Data Mover load
per loading wave (A, B and both scale tiles; A and B only on the buffer scale paths; A and B
halves on the ab_split path), exactly one kernel wait
`s_wait_tensorcnt NUM_BUFFERS-2`, scale words by buffer_load only on the buffer paths, LDS reads
between WMMAs iff B_STREAMING, the cluster barrier (id -3) iff multicast.
"""
import importlib.util
import sys

import pytest

from mxgemm import asm_facts, build, registry

KERNEL = "mx_gemm"
ARCH = "gfx1250"
VARIANTS = registry.get(KERNEL).variants_for(ARCH)
LDS_LIMIT = 327680                      # docs/gfx1250_isa.md §1
TDM_LOADS = {"tdm": 4, "buffer_lds_stage": 2, "buffer_lds_stage_ab_split": 4}
FMT_NAME = {"e4m3": None, "e5m2": "MATRIX_FMT_BF8", "e2m1": "MATRIX_FMT_FP4"}   # None: FP8, not printed


@pytest.fixture(scope="module")
def arts():
    return {registry.variant_id(v): build.artifact(KERNEL, v, ARCH) for v in VARIANTS}


def _hot(art):
    return asm_facts.hot_loop(art.asm, art.symbol)


@pytest.mark.parametrize("v", VARIANTS, ids=registry.variant_id)
def test_gfx1250_variant_resources(arts, v):
    art = arts[registry.variant_id(v)]
    info = art.isa()
    assert info.arch == ARCH and info.wave_size == 32 and ".amdhsa_wavefront_size32 1" in art.asm
    assert info.spills == 0 and info.scratch_bytes == 0, info.summary()
    step = {"e2m1": 64}.get
    rows = v["BM"] * (step(v["A_FMT"], 128) + 16) + v["BN"] * (step(v["B_FMT"], 128) + 16) + 4 * (v["BM"] + v["BN"])
    assert info.lds_bytes == v["NUM_BUFFERS"] * rows <= LDS_LIMIT, info.summary()
    assert info.workgroup_size == 128 and info.occupancy() >= 1


@pytest.mark.parametrize("v", VARIANTS, ids=registry.variant_id)
def test_gfx1250_hot_loop(arts, v):
    hot = _hot(arts[registry.variant_id(v)])
    ops = [l.split()[0] for l in hot]
    wmma = [l for l in hot if l.startswith("v_wmma")]
    tiles_per_wmma = 2 if v["F4_WIDE"] else 1     # 32x16x128_f4: two 16-column B tiles
    assert len(wmma) == v["BM"] * v["BN"] // 1024 // tiles_per_wmma
    assert not any(o.startswith("v_mfma") for o in ops)
    if v["F4_WIDE"]:
        assert {l.split()[0] for l in wmma} == {"v_wmma_scale_f32_32x16x128_f4"}
    else:
        assert {l.split()[0] for l in wmma} == {"v_wmma_scale_f32_16x16x128_f8f6f4"}
        for l in wmma:   # src0 = B rows, src1 = A rows
            for field, fmt in (("matrix_a_fmt", v["B_FMT"]), ("matrix_b_fmt", v["A_FMT"])):
                assert (f"{field}:{FMT_NAME[fmt]}" in l) if FMT_NAME[fmt] else field not in l, l
    assert ops.count("tensor_load_to_lds") == TDM_LOADS[v["SCALE_PATH"]]
    own_wait = f"s_wait_tensorcnt 0x{v['NUM_BUFFERS'] - 2:x}"
    assert hot.count(own_wait) == 1, [l for l in hot if l.startswith("s_wait_tensorcnt")]
    buffer_words = 0 if v["SCALE_PATH"] == "tdm" else (v["BM"] + v["BN"]) // 128
    assert ops.count("buffer_load_b32") == buffer_words
    assert any(o.startswith("ds_store") for o in ops) == (buffer_words > 0)
    first, last = ops.index(wmma[0].split()[0]), len(ops) - 1 - ops[::-1].index(wmma[-1].split()[0])
    assert any(o.startswith("ds_load") for o in ops[first:last]) == bool(v["B_STREAMING"])
    clustered = v["CLUSTER_M"] * v["CLUSTER_N"] > 1
    assert ("s_barrier_signal -3" in hot and "s_barrier_wait -3" in hot) == clustered
    assert "s_barrier_signal -1" in hot and "s_barrier_wait -1" in hot


@pytest.mark.parametrize("v", VARIANTS, ids=registry.variant_id)
def test_gfx1250_epilogue(arts, v):
    """Split-K adds each of the lane's 8 fp32 sums per 16 x 16 tile atomically; otherwise 16-byte
    stores (8 bf16 / f16, or 4 f32 twice)."""
    info = arts[registry.variant_id(v)].isa()
    tiles = v["BM"] * v["BN"] // 1024
    if v["SPLITK"]:
        assert info.count("buffer_atomic_add_f32") == 8 * tiles and info.count("buffer_store") == 0
    else:
        stores = tiles * (2 if v["OUT"] == "f32" else 1)
        assert info.count("buffer_store_b128") == stores and info.count("buffer_atomic") == 0


@pytest.mark.parametrize("v", VARIANTS, ids=registry.variant_id)
def test_gfx1250_cluster_launch_metadata(arts, v):
    meta = asm_facts.metadata(arts[registry.variant_id(v)].asm)["amdhsa.kernels"][0]
    clustered = v["CLUSTER_M"] * v["CLUSTER_N"] > 1
    # grid x walks N tiles, y M tiles
    assert meta.get(".cluster_dims") == ([v["CLUSTER_N"], v["CLUSTER_M"], 1] if clustered else None)


def test_gfx1250_mnemonics(arts, capsys):
    """The sorted gfx1250 mnemonics of every gfx1250 variant (what a gfx1250 emulator must run);
    `pytest -s` prints them."""
    used = sorted({m for a in arts.values() for m in asm_facts.mnemonics(a.asm, a.symbol)})
    assert {"v_wmma_scale_f32_16x16x128_f8f6f4", "v_wmma_scale_f32_32x16x128_f4", "tensor_load_to_lds",
            "buffer_atomic_add_f32", "s_wait_tensorcnt", "s_barrier_signal",
            "s_barrier_wait", "buffer_load_b32", "ds_load_b128"} <= set(used)
    assert not any(m.startswith(("v_mfma", "s_waitcnt")) for m in used)    # no gfx9 instructions
    with capsys.disabled():
        print(f"\n{len(used)} gfx1250 mnemonics of {KERNEL}:\n" + " ".join(used))


def _module():
    src = registry.get(KERNEL).path
    sys.path.insert(0, str(src.parent))
    try:
        spec = importlib.util.spec_from_file_location("_mx_gemm_check", src)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(src.parent))


@pytest.mark.parametrize("arch, opts, rule", [
    ("gfx1250", dict(num_buffers=5), "NUM_BUFFERS 2..4"),
    ("gfx1250", dict(scale_path="vgpr"), "SCALE_PATH in"),
    ("gfx1250", dict(cluster_m=4, cluster_n=8), "CLUSTER_M \\* CLUSTER_N <= 16"),
    ("gfx1250", dict(bm=64, bn=128, scale_path="buffer_lds_stage"), "\\(BM \\+ BN\\) % 128"),
    ("gfx1250", dict(a_fmt="e4m3", f4_wide=1), "F4_WIDE only for e2m1 x e2m1"),
    ("gfx950", dict(b_streaming=1), "no gfx1250 option"),
    ("gfx950", dict(num_buffers=4), "gfx950: NUM_BUFFERS 2 \\(3 without FP6\\)"),
    ("gfx950", dict(a_fmt="e2m3", num_buffers=3), "gfx950: NUM_BUFFERS 2 \\(3 without FP6\\)"),
    ("gfx950", dict(waves=16), "WAVES 4 or 8"),
    ("gfx950", dict(bm=64, waves=8, window_turns=5), "WINDOW_TURNS 1..4"),
    ("gfx1250", dict(waves=8), "gfx1250: no FP6, WAVES 4, WINDOW_TURNS 1"),
])
def test_bad_target_options_are_rejected_before_compiling(arch, opts, rule):
    with pytest.raises(ValueError, match=rule):
        _module().build("mx_gemm", arch, **opts)


def test_op_on_a_gfx1250_gpu_names_the_missing_variant(monkeypatch):
    """The op plans gfx950 variants; where the backend is a gfx1250 GPU the plan fails with a
    GuardError [arch] naming the arch instead of a build error at launch."""
    import torch

    from mxgemm import guards, launcher
    from mxgemm.ops import _op
    monkeypatch.setattr(launcher, "backend_for", lambda device, archs: ("hip", ARCH))
    v = registry.get(KERNEL).variants[0]
    with pytest.raises(guards.GuardError, match=r"\[arch\].*mx_gemm has no gfx1250 variant.*plans for gfx950"):
        _op.kernel_plan("mx_gemm", KERNEL, v, torch.device("cpu"), "test", N=64, M=64, splits=1)
