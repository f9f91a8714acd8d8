"""mxgemm.moe_gemm2_a4w4: MXFP4 x MXFP4 MoE down-projection with top-k weighted bf16 atomics, or
a row per route (out [T, topk, N], ROUTE_ROWS).

Spec: every backend x variant (BM 16/32/64/128 x NT off/on x ROUTE_ROWS) matches
mxgemm.reference.moe_gemm2_a4w4_ref bit for bit on the emulator (race mode, linear workgroup order); both code objects are spill-free; the guards reject what the kernel
cannot run, before any launch, leaving `out` untouched. HIP vs FlyDSL bit-exact and structural
parity: test_moe_gemm2_a4w4_parity.py.

Contract: bitwise in linear workgroup order. The reference adds a token's bf16 addends in sorted
row order, which is the atomics' arrival order when workgroups run in order, and forms each
addend as the kernels do (fp32 MFMA sum, x top-k weight in fp32, RNE to bf16); every output of
every test case is bit-exact (a truncating epilog leaves ~1/3 of them off). In shuffled order
the arrival order differs, and only the atomic-order bound below holds (40-70% bit-exact with
top-k 4-9, and far from the reference where addends cancel). A row per route has no sum to
order: bitwise in any workgroup order.
"""
import pytest
import torch

import mxgemm
from mxgemm import build, guards, launcher, metrics, quant, reference, registry, routing

KERNELS = ("moe_gemm2_a4w4", "moe_gemm2_a4w4_flydsl")
BACKEND = {"moe_gemm2_a4w4": "hip", "moe_gemm2_a4w4_flydsl": "flydsl"}
VARIANTS = registry.get("moe_gemm2_a4w4").variants


# ---- inputs (also used by test_moe_gemm2_a4w4_parity.py) ----

def make_case(tokens, topk, experts, n=256, k=256, block_m=32, skew=0.0, seed=0):
    """Random a4w4 gemm2 inputs. skew > 0 routes most slots to the low experts (uneven
    routing: some experts get several blocks, some none)."""
    g = torch.Generator().manual_seed(seed)
    prob = torch.exp(-skew * torch.arange(experts, dtype=torch.float32))
    ids = torch.stack([torch.multinomial(prob, topk, replacement=False, generator=g) for _ in range(tokens)])
    wts = torch.rand(tokens, topk, generator=g)
    s = routing.moe_sorting(ids, wts, experts, block_m=block_m)
    a, a_scale = quant.quantize_mx(torch.randn(tokens * topk, k, generator=g), "e2m1")
    w, w_scale = quant.quantize_mx(torch.randn(experts, n, k, generator=g) * 0.5, "e2m1")
    return dict(a=a, a_scale=a_scale, w=w, w_scale=w_scale, sorted_token_ids=s.sorted_token_ids,
                sorted_expert_ids=s.sorted_expert_ids, num_valid_ids=s.num_valid_ids,
                sorted_weights=s.sorted_weights, topk=topk, block_m=block_m)


def op_args(c, out):
    return (c["a"], c["a_scale"], c["w"], c["w_scale"], c["sorted_token_ids"], c["sorted_expert_ids"],
            c["num_valid_ids"], c["sorted_weights"], out)


def new_out(c, route_rows=0):
    T, topk, n = c["a"].shape[0] // c["topk"], c["topk"], c["w"].shape[1]
    return torch.zeros(*((T, topk, n) if route_rows else (T, n)), dtype=torch.bfloat16)


def contributions_abs_sum(c):
    """sum over a token's real sorted rows of |bf16 addend| (float64 [T, N]), for error bounds."""
    T, topk = c["a"].shape[0] // c["topk"], c["topk"]
    tok, slot = routing.decode_sorted_id(c["sorted_token_ids"])
    nv = int(c["num_valid_ids"][0])
    a = quant.dequantize_mx(c["a"], c["a_scale"], "e2m1").double()
    w = quant.dequantize_mx(c["w"], c["w_scale"], "e2m1").double()
    s = torch.zeros(T, c["w"].shape[1], dtype=torch.float64)
    for p in range(nv):
        t, sl = int(tok[p]), int(slot[p])
        if t >= T or sl >= topk:
            continue
        e = int(c["sorted_expert_ids"][p // c["block_m"]])
        s[t] += (float(c["sorted_weights"][p]) * (w[e] @ a[t * topk + sl])).abs()
    return s


def run(c, backend, nt, wg_order="linear", seed=0, route_rows=0):
    out = new_out(c, route_rows)
    with launcher.emulator_settings(race_check=True, wg_order=wg_order, seed=seed):
        mxgemm.moe_gemm2_a4w4(*op_args(c, out), block_m=c["block_m"], nt=nt, language=backend)
    return out


def reference_out(c, route_rows=0):
    return reference.moe_gemm2_a4w4_ref(c["a"], c["a_scale"], c["w"], c["w_scale"], c["sorted_token_ids"],
                                        c["sorted_weights"], c["sorted_expert_ids"], c["num_valid_ids"],
                                        c["block_m"], c["topk"], route_rows=bool(route_rows))


def assert_within_atomic_order_bound(out, ref, c, name):
    """Tolerance. The kernel and the reference add the same bf16 addends v_i of a token with
    topk RNE bf16 additions; they may differ (a) in the order of the adds (atomics from
    different workgroups arrive in any order) and (b) in the fp32 sum order inside the MFMA
    (the reference adds 32-wide chunks in increasing order; the MFMA's order is its own),
    which can move an addend by 1 bf16 ulp. Any order of n RNE additions is within
    (n-1) * 2^-8 * sum|v_i| of the exact sum, so two orders differ by at most twice that, plus
    one ulp (2^-7 relative) per addend for (b): |out - ref| <= (2(n-1) + 2n) * 2^-8 * sum|v_i|."""
    n = c["topk"]
    bound = (2 * (n - 1) + 2 * n) * 2.0 ** -8 * contributions_abs_sum(c) + 1e-30
    err = (out.double() - ref.double()).abs()
    bad = err > bound
    assert not bad.any(), (f"{name}: {int(bad.sum())} elements exceed the atomic-order bound; "
                           f"worst excess {float((err - bound).max()):.3g}")


# ---- code objects ----
@pytest.mark.parametrize("variant", VARIANTS, ids=registry.variant_id)
@pytest.mark.parametrize("kernel", KERNELS)
def test_code_object_spill_free_with_reported_occupancy(kernel, variant):
    art = build.artifact(kernel, variant)
    info = art.isa()
    print(f"\n{kernel} [{registry.variant_id(variant)}]: {info.summary(256)}")
    assert info.spills == 0 and info.scratch_bytes == 0
    assert info.lds_bytes == 2 * max(4096, variant["BM"] * 128)   # two A buffers of BM rows x 128 B
    # waves/SIMD with 256-thread workgroups: BM 128's 128 accumulators per lane leave room for one
    assert info.occupancy(256) >= (1 if variant["BM"] == 128 else 2)
    assert info.count("v_mfma_scale_f32_16x16x128_f8f6f4") > 0
    tiles = 4 * variant["BM"] // 16                                         # (n-tile, m-tile) pairs
    if variant["ROUTE_ROWS"]:   # one 8-byte store per pair, no atomic
        assert info.count("global_store_dwordx2") == tiles and info.count("global_atomic") == 0
    else:                       # two packed atomics per pair, no store
        assert info.count("global_atomic_pk_add_bf16") == 2 * tiles and info.count("global_store") == 0
    w_loads = [l for l in art.asm.splitlines() if "buffer_load_dwordx4 v[" in l]
    assert w_loads and all((" nt" in l) == bool(variant["NT"]) for l in w_loads)  # NT = weight loads only
    assert any("buffer_load_dwordx4" in l and " lds" in l for l in art.asm.splitlines())


# ---- numerics on the emulator ----
@pytest.mark.parametrize("variant", VARIANTS, ids=registry.variant_id)
@pytest.mark.parametrize("backend", ["hip", "flydsl"])
def test_matches_reference(backend, variant):
    # BM 64 / 128: enough tokens that expert 0 fills a whole block and part of a second one,
    # so every m-tile and every DMA round of a block carries live rows
    bm = variant["BM"]
    c = make_case(tokens=8 if bm <= 32 else bm + bm // 2, topk=3, experts=6, k=512, block_m=bm, skew=0.5, seed=1)
    if bm > 32:
        tokens, _ = routing.decode_sorted_id(c["sorted_token_ids"][:int(c["num_valid_ids"][0])])
        live_per_block = (tokens < c["a"].shape[0] // c["topk"]).reshape(-1, bm).sum(1)
        assert live_per_block.max() == bm and (live_per_block < bm).any()
    out = run(c, backend, variant["NT"], route_rows=variant["ROUTE_ROWS"])
    ref = reference_out(c, variant["ROUTE_ROWS"])
    assert ref.abs().max() > 0
    metrics.assert_bitwise_equal(out, ref, f"{backend} {variant}")


@pytest.mark.parametrize("backend", ["hip", "flydsl"])
def test_route_rows_any_order_touch_only_routed_rows(backend):
    """A row per route: bitwise in shuffled workgroup order too (no sum to order); the rows no
    sorted row names (the last token's, made padding here) keep their bytes; the top-k sum of the
    rows is the atomic form's product within the atomic-order bound."""
    c = make_case(tokens=12, topk=4, experts=6, k=512, block_m=16, skew=0.5, seed=3)
    T, topk = 12, 4
    tok, _ = routing.decode_sorted_id(c["sorted_token_ids"])
    last = tok == T - 1
    c["sorted_token_ids"] = torch.where(last, (topk << 24) | T, c["sorted_token_ids"])
    c["sorted_weights"] = torch.where(last, 0.0, c["sorted_weights"])
    out = new_out(c, 1).fill_(3.0)
    with launcher.emulator_settings(race_check=True, wg_order="shuffled", seed=7):
        mxgemm.moe_gemm2_a4w4(*op_args(c, out), language=backend)
    ref = reference_out(c, 1)
    assert bool((out[-1] == 3.0).all()) and bool((ref[:-1].abs().sum((1, 2)) > 0).all())
    metrics.assert_bitwise_equal(out[:-1], ref[:-1], f"{backend} route rows, shuffled")
    out[-1] = 0
    assert_within_atomic_order_bound(out.double().sum(1).to(torch.bfloat16), reference_out(c), c,
                                     f"{backend} route rows summed")


@pytest.mark.parametrize("bm", [32, 64])
@pytest.mark.parametrize("backend", ["hip", "flydsl"])
def test_route_rows_xcd_order_covers_a_grid_cut_at_the_live_blocks(backend, bm):
    """Above 16-row blocks a row per route runs its tiles in XCD order, a permutation of each chunk
    of 8 row blocks. moe_sorting's buffers end in dead blocks; cut at the live ones (as a caller
    sizing the grid to the routing may), the last chunk is partial and live: every tile still runs
    once. Three column blocks: with one the order is the grid's."""
    c = make_case(tokens=48 if bm == 32 else 96, topk=4, experts=12, n=768, k=256, block_m=bm, seed=5)
    n = int(c["num_valid_ids"][0])
    c.update(sorted_token_ids=c["sorted_token_ids"][:n].contiguous(), sorted_weights=c["sorted_weights"][:n].contiguous(),
             sorted_expert_ids=c["sorted_expert_ids"][:n // bm].contiguous())
    blocks = c["sorted_expert_ids"].numel()
    assert blocks > 8 and blocks % 8      # a full chunk and a partial one
    out = run(c, backend, 0, route_rows=1)
    metrics.assert_bitwise_equal(out, reference_out(c, 1), f"{backend} BM {bm}, {blocks} blocks")


def test_explain_names_kernel_variant_and_why():
    c = make_case(tokens=4, topk=2, experts=4, block_m=16)
    plan = mxgemm.explain("moe_gemm2_a4w4", *op_args(c, new_out(c)))
    assert plan.kernel == "moe_gemm2_a4w4" and plan.variant == {"BM": 16, "NT": 1, "ROUTE_ROWS": 0}
    assert plan.grid == (1, c["sorted_expert_ids"].numel(), 1) and plan.block == (256, 1, 1)
    assert "BM=16" in str(plan) and "routing" in str(plan) and "atomics" in str(plan)
    plan = mxgemm.explain("moe_gemm2_a4w4", *op_args(c, new_out(c, 1)), nt=False, language="flydsl")
    assert plan.kernel == "moe_gemm2_a4w4_flydsl" and plan.variant == {"BM": 16, "NT": 0, "ROUTE_ROWS": 1}
    assert "a row per route" in str(plan)


@pytest.mark.parametrize("bm", [16, 32, 64])
def test_one_block_layout_runs_its_own_block_size(bm):
    # one token, one expert: moe_sorting's buffer is one block, which every larger block size fits
    c = make_case(tokens=1, topk=1, experts=1, block_m=bm)
    assert c["sorted_expert_ids"].numel() == 1
    assert mxgemm.explain("moe_gemm2_a4w4", *op_args(c, new_out(c))).variant["BM"] == bm


# ---- guards: rejected before any launch, out untouched ----
def _meta(*shape, dtype=torch.uint8):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _bad_cases():
    """(name, mutate(args dict, kwargs dict), rule)."""
    def setk(key, value):
        def f(a, kw):
            a[key] = value
        return f

    def setkw(key, value):
        def f(a, kw):
            kw[key] = value
        return f

    def k_not_256(a, kw):   # K = 224: a multiple of 32, not of 256
        a["a"], a["a_scale"] = a["a"][:, :112].contiguous(), a["a_scale"][:, :7].contiguous()
        a["w"], a["w_scale"] = a["w"][:, :, :112].contiguous(), a["w_scale"][:, :, :7].contiguous()

    def n_not_256(a, kw):
        a["w"], a["w_scale"], a["out"] = a["w"][:, :128].contiguous(), a["w_scale"][:, :128].contiguous(), \
            a["out"][:, :128].contiguous()

    def a_over_2gb(a, kw):  # 2^24 rows x 128 B = 2^31 B through one raw buffer resource
        T = 1 << 23
        a["a"], a["a_scale"] = _meta(2 * T, 128), _meta(2 * T, 8)
        a["out"] = _meta(T, 256, dtype=torch.bfloat16)
        for key in ("w", "w_scale", "sorted_token_ids", "sorted_expert_ids", "num_valid_ids", "sorted_weights"):
            a[key] = torch.empty_like(a[key], device="meta")

    def w_expert_over_2gb(a, kw):  # one expert's slice N*K/2 = 2^31 B
        for key in a:
            a[key] = torch.empty_like(a[key], device="meta")
        a["w"], a["w_scale"] = _meta(1, 1 << 16, 1 << 15), _meta(1, 1 << 16, 1 << 11)
        a["a"], a["a_scale"] = _meta(8, 1 << 15), _meta(8, 1 << 11)
        a["out"] = _meta(4, 1 << 16, dtype=torch.bfloat16)

    return [
        ("K % 256", k_not_256, "D_INTER%256"),
        ("N % 256", n_not_256, "D_HIDDEN%256"),
        ("a dtype", setk("a", torch.zeros(8, 128, dtype=torch.float16)), "dtype"),
        ("out dtype", setk("out", torch.zeros(4, 256, dtype=torch.float32)), "dtype"),
        ("ids dtype", setk("sorted_token_ids", torch.zeros(64, dtype=torch.int64)), "dtype"),
        ("weights dtype", setk("sorted_weights", torch.zeros(64, dtype=torch.float16)), "dtype"),
        ("a_scale shape", setk("a_scale", torch.zeros(8, 4, dtype=torch.uint8)), "shape"),
        ("w_scale shape", setk("w_scale", torch.zeros(4, 256, 4, dtype=torch.uint8)), "shape"),
        ("a rows not T*topk", setk("a", torch.zeros(7, 128, dtype=torch.uint8)), "shape"),
        ("route rows out not [T, topk, N]", setk("out", torch.zeros(4, 3, 256, dtype=torch.bfloat16)), "shape"),
        ("out 4-D", setk("out", torch.zeros(4, 2, 1, 256, dtype=torch.bfloat16)), "shape"),
        ("non-contiguous w", setk("w", torch.zeros(4, 128, 256, dtype=torch.uint8).transpose(1, 2)),
         "contiguity"),
        ("block_m not a kernel block size", setkw("block_m", 48), "block_m"),
        ("block_m vs routing", setkw("block_m", 32), "block_m"),
        ("language", setkw("language", "triton"), "language"),
        ("deprecated backend= disagreeing with language=", lambda a, kw: kw.update(backend="hip", language="flydsl"),
         "language"),
        ("a over 2 GB", a_over_2gb, "2GB-voffset"),
        ("w expert over 2 GB", w_expert_over_2gb, "2GB-voffset"),
        ("arch (meta device)", lambda a, kw: [a.__setitem__(k, torch.empty_like(v, device="meta"))
                                              for k, v in list(a.items())], "arch"),
    ]


@pytest.mark.parametrize("name,mutate,rule", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_guard_rejects(name, mutate, rule):
    c = make_case(tokens=4, topk=2, experts=4, block_m=16)
    out = new_out(c).fill_(1.0)
    keys = ("a", "a_scale", "w", "w_scale", "sorted_token_ids", "sorted_expert_ids", "num_valid_ids",
            "sorted_weights", "out")
    args = dict(zip(keys, op_args(c, out)))
    kw = {}
    mutate(args, kw)
    with pytest.raises(guards.GuardError, match=rf"\[{rule}\]"):
        mxgemm.moe_gemm2_a4w4(*[args[k] for k in keys], **kw)
    with pytest.raises(guards.GuardError, match=rf"\[{rule}\]"):
        mxgemm.explain("moe_gemm2_a4w4", *[args[k] for k in keys], **kw)
    assert bool((out == 1.0).all())  # nothing written


# ---- data rules and messages in the user's units ----
def test_backend_is_a_deprecated_alias_of_language():
    c = make_case(tokens=4, topk=2, experts=4, block_m=16)
    with pytest.warns(DeprecationWarning, match="language="):
        plan = mxgemm.explain("moe_gemm2_a4w4", *op_args(c, new_out(c)), backend="flydsl")
    assert plan.kernel == "moe_gemm2_a4w4_flydsl"


@pytest.mark.parametrize("backend", ["hip", "flydsl"])
def test_expert_id_beyond_w_raises_before_launch(backend):
    c = make_case(tokens=4, topk=2, experts=4, block_m=16)
    c["sorted_expert_ids"] = c["sorted_expert_ids"].clone()
    c["sorted_expert_ids"][1] = 99
    out = new_out(c).fill_(1.0)
    with pytest.raises(guards.GuardError, match=r"\[expert-id\] sorted_expert_ids\[1\] = 99 but w holds 4 experts"):
        mxgemm.moe_gemm2_a4w4(*op_args(c, out), language=backend)
    assert bool((out == 1.0).all())


def test_routing_over_more_experts_than_w_raises():
    c = make_case(tokens=8, topk=2, experts=4, block_m=16)
    top = int(c["sorted_expert_ids"].max())
    assert top >= 2
    c["w"], c["w_scale"] = c["w"][:2].contiguous(), c["w_scale"][:2].contiguous()
    with pytest.raises(guards.GuardError, match=rf"\[expert-id\] .* = {top} but w holds 2 experts"):
        mxgemm.moe_gemm2_a4w4(*op_args(c, new_out(c)))


def test_shape_messages_blame_the_right_tensor_in_elements():
    c = make_case(tokens=4, topk=2, experts=4, block_m=16)
    out = torch.zeros(3, 256, dtype=torch.bfloat16)
    with pytest.raises(guards.GuardError, match=r"\[shape\] out has shape \[3, 256\]: its T = 3"):
        mxgemm.moe_gemm2_a4w4(*op_args(c, out))
    c["a"], c["a_scale"] = c["a"][:, :64].contiguous(), c["a_scale"][:, :4].contiguous()
    with pytest.raises(guards.GuardError, match=r"\[shape\] a has K = 128 .* but w has K = 256"):
        mxgemm.moe_gemm2_a4w4(*op_args(c, new_out(c)))
