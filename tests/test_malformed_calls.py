"""Nothing silently wrong: malformed calls to the public ops raise GuardError naming the rule
before any launch, with every output byte untouched; the plan cache gives a warm call the verdict
of a cold one; the ops trace under torch.compile with changing shapes and pass torch's opcheck."""
import functools
import types

import pytest
import torch

import mxgemm
from mxgemm import deep_gemm, guards, registry, routing, specs
from mxgemm.ops._op import OPS
from mxgemm.primus_turbo import GroupedGemmFP8Backend
from mxgemm.quant import quantize_mx, tensorwise_cast_to_fp8


@functools.cache
def _small_calls() -> dict:
    """op -> one small call that runs quickly on the emulator (the first race call of each op)."""
    calls = {}
    for k in registry.KERNELS.values():
        if "gfx950" not in k.archs:
            continue
        for v in k.variants_for("gfx950"):
            for c in specs.race_calls(k.name, v):
                calls.setdefault(c.op, c)
    return calls


def small(op: str):
    """A fresh copy of ``op``'s small call: (args list, kw dict)."""
    c = _small_calls()[op]
    fresh = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [fresh(v) for v in c.args], {k: fresh(v) for k, v in c.kw.items()}


def flat_of(op: str, args, kw) -> list:
    return OPS[op].flatten(args, kw)


def call_flat(op: str, flat):
    o = OPS[op]
    n = o.n_positional
    return o(*flat[:n], **dict(zip(o.names[n:], flat[n:])))


def out_like(op: str, flat, **kw) -> torch.Tensor:
    p = OPS[op].plan(flat)
    return torch.empty(p.out_shape, dtype=p.out_dtype, **kw)


def rejects(rule: str, fn, *watched):
    """fn() raises GuardError [rule]; every watched tensor keeps its bytes."""
    before = [t.clone() for t in watched]
    with pytest.raises(guards.GuardError, match=rf"\[{rule}\]") as e:
        fn()
    for t, b in zip(watched, before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8)), "a rejected call changed an output"
    return str(e.value)


OUT_OPS = tuple(OPS)


def _with_out(op):
    """flat args of op's small call, with an out tensor (given or made)."""
    args, kw = small(op)
    flat = flat_of(op, args, kw)
    o = OPS[op].out_index
    if flat[o] is None:
        flat[o] = out_like(op, flat)
    return flat


def _tensor_params(op):
    return [OPS[op].names[i] for i in OPS[op].tensors if OPS[op].names[i] != "out"]


# --- out ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,param", [(op, p) for op in OUT_OPS for p in _tensor_params(op)])
def test_out_sharing_memory_with_an_input_is_refused(op, param):
    """out's last bytes are the first bytes of the input (both in one buffer)."""
    flat = _with_out(op)
    i, o = OPS[op].names.index(param), OPS[op].out_index
    assert flat[i] is not None and flat[i].numel(), f"the small call of {op} lacks {param}"
    t, out = flat[i], flat[o]
    nt, no = t.numel() * t.element_size(), out.numel() * out.element_size()
    shift = max(no - 16, 0) // 16 * 16            # out's last bytes are the input's first
    base = torch.zeros(shift + nt + no, dtype=torch.uint8)
    out_view = base[:no].view(out.dtype).view(out.shape)
    in_view = base[shift:shift + nt].view(t.dtype).view(t.shape)
    in_view.copy_(t)
    flat[i], flat[o] = in_view, out_view
    msg = rejects("out-alias", lambda: call_flat(op, flat), base)
    assert param in msg


def test_out_next_to_an_input_is_accepted():
    """Adjacent, not overlapping: no false alarm."""
    args, kw = small("smallm_mxfp8_gemm")
    a = args[0]
    out = torch.empty(a.shape[0], args[2].shape[0], dtype=torch.bfloat16)
    base = torch.empty(a.numel() + out.numel() * 2, dtype=torch.uint8)
    a2 = base[:a.numel()].view(a.dtype).view(a.shape)
    a2.copy_(a)
    out2 = base[a.numel():].view(torch.bfloat16).view(out.shape)
    want = mxgemm.smallm_mxfp8_gemm(*args, **kw)
    mxgemm.smallm_mxfp8_gemm(a2, *args[1:], out=out2, **kw)
    assert torch.equal(out2, want)


def test_issue_examples_of_out_aliasing():
    """smallm out=a.view(bf16) and mx_gemm out=a.view(fp32) with split-K (which zeroes out first)."""
    a, sa = quantize_mx(torch.randn(4, 256), "e4m3")
    b, sb = quantize_mx(torch.randn(128, 256), "e4m3")
    rejects("out-alias", lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=a.view(torch.bfloat16)), a)
    b, sb = quantize_mx(torch.randn(64, 256), "e4m3")
    rejects("out-alias", lambda: mxgemm.mx_gemm(a, sa, b, sb, out=a.view(torch.float32), out_dtype=torch.float32,
                                                config="BM=64,BN=64,SPLITS=2"), a)


@pytest.mark.parametrize("library", ["mock", "mock-noop"])
def test_cached_gpu_path_refuses_overlap_and_requires_grad(library):
    """The hip backend's cached path (a recent plan, the launch comparing the addresses it packs)
    refuses what the first call's checks refused."""
    from mxgemm.launcher import use_hip_library
    a, sa = quantize_mx(torch.randn(2, 256), "e4m3")
    b, sb = quantize_mx(torch.randn(128, 256), "e4m3")    # out [M, K/2] bf16 spans a's bytes exactly
    kw = {}
    n = 128
    with use_hip_library(library):
        out = torch.empty(a.shape[0], n, dtype=torch.bfloat16)
        mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=out, **kw)
        assert mxgemm.explain("smallm_mxfp8_gemm", a, sa, b, sb, out=out, **kw).backend == "hip"
        rejects("out-alias", lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=a.view(torch.bfloat16), **kw), a)
        grad = out.clone().requires_grad_()
        for _ in range(2):
            rejects("out-requires-grad", lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=grad, **kw))


@pytest.mark.parametrize("op", OUT_OPS)
def test_out_that_requires_grad_is_refused(op):
    flat = _with_out(op)
    o = OPS[op].out_index
    flat[o] = flat[o].float().requires_grad_() if not flat[o].is_floating_point() else flat[o].requires_grad_()
    rejects("out-requires-grad", lambda: call_flat(op, flat), flat[o].detach())


# --- MoE routing ------------------------------------------------------------------------------------
MOE = ("moe_mxfp8_grouped_gemm", "moe_gemm2_a4w4")


def _moe(op):
    flat = _with_out(op)
    names = OPS[op].names
    return flat, {n: flat[names.index(n)] for n in ("sorted_token_ids", "sorted_expert_ids", "num_valid_ids", "out")}


def _first_real(ids, tokens):
    return int(((ids[:] & 0xFFFFFF) < tokens).nonzero()[0])


def _tokens(op, flat):
    x = OPS[op].namespace(flat)
    return x.a.shape[0] if op == MOE[0] else x.out.shape[0]


@pytest.mark.parametrize("op", MOE)
@pytest.mark.parametrize("case", ["slot>=topk", "num_valid=-1", "num_valid>len", "expert>=E"])
def test_malformed_routing_is_refused_before_launch(op, case):
    flat, t = _moe(op)
    ids, nv = t["sorted_token_ids"], t["num_valid_ids"]
    if case == "slot>=topk":
        p = _first_real(ids, _tokens(op, flat))
        ids[p] = (ids[p] & 0xFFFFFF) | (_topk(op, flat) << 24)
        rule = "sorted_token_ids"
    elif case == "num_valid=-1":
        nv[0], rule = -1, "num_valid_ids"
    elif case == "num_valid>len":
        nv[0], rule = ids.numel() + 1, "num_valid_ids"
    else:
        t["sorted_expert_ids"][0], rule = OPS[op].namespace(flat).w.shape[0], "expert-id"
    t["out"].fill_(7)
    rejects(rule, lambda: call_flat(op, flat), t["out"])


def test_moe_mxfp8_slot_is_checked_against_topk_from_weights_or_the_argument():
    """The slot names out's row (token * topk + slot): a slot >= topk is rejected whether topk
    comes from topk_weights or, for 2-D a without them, from the topk argument."""
    flat, t = _moe(MOE[0])
    x = OPS[MOE[0]].namespace(flat)
    assert x.topk_weights is not None and x.topk_weights.shape[1] == 1 and x.a.dim() == 2
    p = _first_real(t["sorted_token_ids"], x.a.shape[0])
    t["sorted_token_ids"][p] |= 1 << 24
    rejects("sorted_token_ids", lambda: call_flat(MOE[0], flat))
    flat[OPS[MOE[0]].names.index("topk_weights")] = None
    flat[OPS[MOE[0]].names.index("topk")] = 1
    rejects("sorted_token_ids", lambda: call_flat(MOE[0], flat))


def _topk(op, flat):
    x = OPS[op].namespace(flat)
    return x.topk_weights.shape[1] if op == MOE[0] else x.a.shape[0] // x.out.shape[0]


@pytest.mark.parametrize("op", MOE)
def test_validate_false_skips_the_routing_check(op):
    """A slot >= topk on a token below T - 1 stays in bounds (it reads the next token's row), so
    the unchecked call runs: validate=False is the caller's promise, not a second check."""
    flat, t = _moe(op)
    ids, T = t["sorted_token_ids"], _tokens(op, flat)
    p = int(((ids & 0xFFFFFF) < T - 1).nonzero()[0])
    ids[p] = (ids[p] & 0xFFFFFF) | (_topk(op, flat) << 24)
    rejects("sorted_token_ids", lambda: call_flat(op, flat))
    flat[OPS[op].names.index("validate")] = False
    assert OPS[op].plan(flat).kernel is not None
    call_flat(op, flat)


def test_empty_experts_are_a_guard_error_not_an_index_error():
    for op in MOE:
        flat, _ = _moe(op)
        x = OPS[op].namespace(flat)
        names = OPS[op].names
        flat[names.index("w")], flat[names.index("w_scale")] = x.w[:0], x.w_scale[:0]
        rejects("expert-id", lambda: call_flat(op, flat))


def test_a4w4_takes_an_empty_batch_like_moe_mxfp8():
    flat, t = _moe(MOE[1])
    names = OPS[MOE[1]].names
    x = OPS[MOE[1]].namespace(flat)
    srt = routing.moe_sorting(torch.zeros(0, 1, dtype=torch.int64), torch.zeros(0, 1), x.w.shape[0], block_m=16)
    flat[names.index("a")], flat[names.index("a_scale")] = x.a[:0], x.a_scale[:0]
    for n in ("sorted_token_ids", "sorted_expert_ids", "num_valid_ids"):
        flat[names.index(n)] = getattr(srt, n)
    flat[names.index("sorted_weights")] = srt.sorted_weights
    flat[names.index("out")] = x.out[:0]
    assert call_flat(MOE[1], flat).shape == (0, x.out.shape[1])


# --- grouped and deep_gemm data checks on empty outputs -------------------------------------------
def test_variable_k_data_checks_run_when_the_output_is_empty():
    """Zero groups: the output [0, M, N] is empty, but group_offs is still checked (the check
    was skipped with the launch)."""
    args, kw = small("grouped_gemm_fp8_variable_k")
    args[4] = torch.zeros(0, dtype=torch.int64)
    rejects("group_offs", lambda: mxgemm.grouped_gemm_fp8_variable_k(*args[:5], torch.tensor([3]), **kw))


def test_zero_groups_with_rows_agree_between_forward_and_wgrad():
    """All rows a padded tail (sum(group_lens) = 0 <= rows): the forward writes zero rows, the
    wgrad an empty [0, M, N]; before, the wgrad returned empty and the forward refused."""
    a, b = torch.randn(64, 128).to(torch.float8_e4m3fn), torch.randn(0, 32, 128).to(torch.float8_e4m3fn)
    none, one = torch.zeros(0, dtype=torch.int64), torch.ones(1)
    assert torch.equal(mxgemm.grouped_gemm_fp8_kernel(a, one, b, one.clone(), none), torch.zeros(64, 32).bfloat16())
    assert mxgemm.grouped_gemm_fp8_variable_k(a, one, a.clone(), one.clone(), none).shape == (0, 128, 128)


def test_deep_gemm_with_zero_groups_in_b_is_refused():
    args, kw = small("deep_gemm_fp8_grouped_gemm")
    a, sfa, b, sfb, m_indices, d = args
    assert not kw["masked"]
    m_indices[:] = 0
    m_indices[len(m_indices) // 2:] = 1
    d.fill_(3)
    rejects("m_indices", lambda: mxgemm.deep_gemm_fp8_grouped_gemm(a, sfa, b[:0], sfb[:0], m_indices, d, **kw), d)


def test_deep_gemm_blames_m_indices_not_layout():
    args, kw = small("deep_gemm_fp8_grouped_gemm")
    a, sfa, b, sfb, m_indices, d = args
    for bad in (m_indices.tolist(), None):
        with pytest.raises(guards.GuardError, match=r"m_indices") as e:
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, bad)
        assert "layout" not in str(e.value)


# --- the plan cache: a warm call gets a cold call's verdict -------------------------------------------
def _verdict(op, flat):
    try:
        return str(OPS[op].plan(flat))
    except guards.GuardError as e:
        return f"GuardError {e}"


def _layouts(t):
    """Same shape, other strides: column-major, column-major with a padded pitch, a padded row pitch."""
    if t is None or t.dim() < 2:
        return []
    col = t.mT.contiguous().mT
    col_wide = torch.empty(*t.shape[:-2], t.shape[-1], t.shape[-2] + 8, dtype=t.dtype).mT[..., :t.shape[-2], :]
    wide = torch.empty(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype)[..., :t.shape[-1]]
    return [col, col_wide, wide]


def _deep_gemm_multi_k():
    """A deep_gemm call whose scales have several K blocks (so strides tell layouts apart)."""
    v = registry.find_variant(registry.get("blockscale_grouped_gemm"), BM=128, BN=128, MASKED=0, UE8M0=0, OUT="bf16")
    return list(specs.blockscale_grouped_gemm._call(specs.Inputs(), v, 2, torch.tensor([128, 100]), 128, 128, 512).args)


@pytest.mark.parametrize("op", OUT_OPS)
def test_warm_plan_cache_gives_the_cold_verdict(op):
    """For each tensor: call with layout X (warm), then Y; Y's verdict must equal a cold call's."""
    flat = flat_of(op, _deep_gemm_multi_k(), {}) if op == "deep_gemm_fp8_grouped_gemm" else _with_out(op)
    for i in OPS[op].tensors:
        variants = [flat[i], *_layouts(flat[i])]
        for x in variants:
            for y in variants:
                if x is y:
                    continue
                fx, fy = list(flat), list(flat)
                fx[i], fy[i] = x, y
                OPS[op].clear_plans()
                cold = _verdict(op, fy)
                OPS[op].clear_plans()
                _verdict(op, fx)
                assert _verdict(op, fy) == cold, (op, OPS[op].names[i], x.stride(), y.stride())


def test_deep_gemm_mn_major_scales_then_another_stride():
    """The case that was poisoned: a valid MN-major sfa, then a view of other strides."""
    a, sfa, b, sfb, m_indices, d = _deep_gemm_multi_k()
    mn = deep_gemm.get_mn_major_tma_aligned_tensor(sfa)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, mn), (b, sfb), d, m_indices)
    bad = torch.empty(sfa.shape[1], sfa.shape[0] + 8).t()[:sfa.shape[0]]   # rows unit-stride, pitch M + 8
    bad.copy_(sfa)
    assert not bad.is_contiguous() and bad.stride() != mn.stride()
    d.fill_(5)
    rejects("layout", lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, bad), (b, sfb), d, m_indices), d)


# --- entry points: clear errors, not internal exceptions -------------------------------------------
@pytest.mark.parametrize("op", ["grouped_gemm_fp8_kernel", "grouped_gemm_fp8_variable_k", "grouped_gemm_fp8"])
def test_group_lens_as_a_list_names_the_argument(op):
    if op == "grouped_gemm_fp8":
        a, b = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(2, 32, 128, dtype=torch.bfloat16)
        fn = lambda: mxgemm.grouped_gemm_fp8(a, b, [32, 32])  # noqa: E731
    else:
        args, kw = small(op)
        args[4] = args[4].tolist()
        fn = lambda: getattr(mxgemm, op)(*args[:5], **kw)  # noqa: E731
    with pytest.raises(guards.GuardError, match=r"\[type\] group_lens must be a torch.Tensor"):
        fn()


def test_grouped_gemm_fp8_on_an_empty_batch():
    a = torch.randn(0, 128, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(2, 32, 128, dtype=torch.bfloat16, requires_grad=True)
    out = mxgemm.grouped_gemm_fp8(a, b, torch.zeros(2, dtype=torch.int64))
    assert out.shape == (0, 32)
    out.sum().backward()
    assert torch.equal(b.grad, torch.zeros_like(b))


def test_deep_gemm_grid_past_the_tile_order_limit_is_refused(monkeypatch):
    # a real call past 2^21 workgroups needs b of 1 GB or more (G x N rows of 16 or more bytes), so
    # the limit is lowered to the small call's own grid
    from mxgemm.ops import blockscale_grouped_gemm as op
    name = "deep_gemm_fp8_grouped_gemm"
    args, kw = small(name)
    d = args[5]
    d.fill_(3)
    grid = OPS[name].plan(flat_of(name, args, kw)).grid
    workgroups = grid[0] * grid[1] * grid[2]
    monkeypatch.setattr(op, "MAX_WORKGROUPS", workgroups)
    OPS[name].clear_plans()
    msg = rejects("workgroups", lambda: mxgemm.deep_gemm_fp8_grouped_gemm(*args, **kw), d)
    assert f"make {workgroups} workgroups" in msg and "split the call" in msg
    monkeypatch.setattr(op, "MAX_WORKGROUPS", workgroups + 1)
    mxgemm.deep_gemm_fp8_grouped_gemm(*args, **kw)
    OPS[name].clear_plans()


@pytest.mark.parametrize("bad", [{"BM": 128}, "BM=x,BN=64", "BM", "nosuch"])
def test_deep_gemm_config_errors_name_the_rule(bad):
    args, kw = small("deep_gemm_fp8_grouped_gemm")
    msg = rejects("config", lambda: mxgemm.deep_gemm_fp8_grouped_gemm(*args, **{**kw, "config": bad}))
    assert "BM (int)" in msg and "BN (int)" in msg


@pytest.mark.parametrize("bad", ["M_TILE=x", "M_TILE", "nosuch"])
def test_smallm_config_errors_list_the_keys(bad):
    args, kw = small("smallm_mxfp8_gemm")
    msg = rejects("config", lambda: mxgemm.smallm_mxfp8_gemm(*args, **{**kw, "config": bad}))
    assert "M_TILE (int)" in msg and "kernel (str)" in msg


# --- Primus-Turbo backend: can_handle is True exactly when execute runs ------------------------------
def _backend_kw(**over):
    a = torch.randn(96, 128).to(torch.float8_e4m3fn)
    b = torch.randn(2, 32, 128).to(torch.float8_e4m3fn)
    lens = torch.tensor([48, 48])
    kw = dict(a=a, b=b, a_scales=torch.ones(1), b_scales=torch.ones(1), group_lens=lens,
              group_offs=torch.tensor([0, 48, 96]), trans_a=False, trans_b=True, out_dtype=torch.bfloat16,
              granularity="tensorwise", num_cu=None)
    kw.update(over)
    return kw


@pytest.mark.parametrize("over", [dict(group_lens=torch.tensor([50, 50]), group_offs=torch.tensor([0, 50, 100])),
                                  dict(a=None), dict(group_lens=[48, 48]), dict(b=None)])
def test_can_handle_is_false_when_execute_would_raise(over):
    kw = _backend_kw(**over)
    assert GroupedGemmFP8Backend.can_handle(**kw) is False
    with pytest.raises(guards.GuardError):
        GroupedGemmFP8Backend.execute(**kw)


def test_can_handle_is_true_when_execute_runs():
    kw = _backend_kw()
    assert GroupedGemmFP8Backend.can_handle(**kw)
    assert GroupedGemmFP8Backend.execute(**kw).shape == (96, 32)


# --- torch.compile and opcheck ------------------------------------------------------------------
def test_compiled_op_with_a_changing_batch_size():
    """torch's default dynamic shapes: the second batch size recompiles with a symbolic M."""
    torch._dynamo.reset()
    b, sb = quantize_mx(torch.randn(64, 256), "e4m3")
    f = torch.compile(lambda a, sa, b, sb: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb), backend="aot_eager")
    for m in (4, 8, 6):
        a, sa = quantize_mx(torch.randn(m, 256), "e4m3")
        assert torch.equal(f(a, sa, b, sb), mxgemm.smallm_mxfp8_gemm(a, sa, b, sb))


def _compile_args(op):
    flat = flat_of(op, *small(op))
    o = OPS[op]
    n = o.n_positional
    tensors = [i for i in o.tensors if flat[i] is not None]
    return flat, n, tensors


@pytest.mark.parametrize("op", OUT_OPS)
def test_every_op_compiles_with_symbolic_shapes(op):
    """dynamic=True: every size symbolic; the functional form (and the out form) traces in one
    graph and gives the eager result."""
    torch._dynamo.reset()
    flat, n, tensors = _compile_args(op)
    o = OPS[op]

    def run(*ts):
        f = list(flat)
        for i, t in zip(tensors, ts):
            f[i] = t
        return call_flat(op, f)

    eager = run(*(flat[i].clone() for i in tensors)).clone()
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True, dynamic=True)
    got = compiled(*(flat[i].clone() for i in tensors))
    assert torch.equal(got.view(torch.uint8), eager.view(torch.uint8)) or op == "moe_gemm2_a4w4" and \
        torch.allclose(got.float(), eager.float(), rtol=1e-2, atol=1e-2)
    assert o.name == op


@pytest.mark.parametrize("op", ["grouped_gemm_fp8_kernel", "grouped_gemm_fp8_variable_k"])
def test_group_offs_none_traces_fullgraph(op):
    torch._dynamo.reset()
    args, kw = small(op)
    fn = getattr(mxgemm, op)
    want = fn(*args[:5], **kw)
    got = torch.compile(lambda *a: fn(*a, **kw), backend="aot_eager", fullgraph=True)(*args[:5])
    assert torch.equal(got, want)


def test_autograd_grouped_gemm_fp8_traces_fullgraph_without_group_offs():
    torch._dynamo.reset()
    a, b, lens = torch.randn(64, 128).bfloat16(), torch.randn(2, 32, 128).bfloat16(), torch.tensor([32, 32])
    want = mxgemm.grouped_gemm_fp8(a, b, lens)
    got = torch.compile(mxgemm.grouped_gemm_fp8, backend="aot_eager", fullgraph=True)(a, b, lens)
    assert torch.equal(got, want)


def _custom_ops():
    for name, o in OPS.items():
        if o._functional_op is not None:
            yield pytest.param(name, "functional", id=f"{name}-functional")
        yield pytest.param(name, "out", id=f"{name}-out")


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.mark.parametrize("op,form", list(_custom_ops()))
def test_opcheck(op, form):
    """torch.library.opcheck's tests (schema, autograd registration, fake tensor, AOT dispatch
    static and dynamic) on every custom op. test_schema cannot run on a call with fp8 tensors:
    torch's SchemaCheckMode compares inputs before and after with arithmetic that has no CPU
    float8 kernel ('mul_cpu_reduced_float' not implemented for 'Float8_e4m3fn'), so calls with
    fp8 tensors run the other four."""
    o = OPS[op]
    flat = _with_out(op) if form == "out" else flat_of(op, *small(op))
    if form == "functional":
        flat = [v for i, v in enumerate(flat) if i != o.out_index]
    target = o._functional_op if form == "functional" else o._out_op
    fp8 = any(isinstance(v, torch.Tensor) and v.dtype in FP8 for v in flat)
    tests = [t for t in ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
             if not (fp8 and t == "test_schema")]
    torch.library.opcheck(target, tuple(flat), test_utils=tests)


def test_fake_out_shape_matches_the_planners():
    """The shape arithmetic the fake impl uses on symbolic shapes is the planner's out_shape."""
    for op, o in OPS.items():
        if o._functional_op is None:
            continue
        flat = flat_of(op, *small(op))
        p = o.plan(flat)
        shape, dtype = o._out_shape(types.SimpleNamespace(**dict(zip(o.names, flat))))
        assert (tuple(shape), dtype) == (tuple(p.out_shape), p.out_dtype), op


def test_tensorwise_cast_of_an_empty_tensor():
    q, s = tensorwise_cast_to_fp8(torch.zeros(0, 16))
    assert q.shape == (0, 16) and torch.isfinite(s).all()


def test_scalar_arguments_are_checked_against_the_schema():
    """A bool parameter takes True / False / 0 / 1 (nt=2 was taken as True); an int one no bool."""
    flat, _ = _moe(MOE[1])
    flat[OPS[MOE[1]].names.index("nt")] = 2
    assert "nt must be None or bool; got 2" in rejects("type", lambda: call_flat(MOE[1], flat))
    flat[OPS[MOE[1]].names.index("nt")] = 1
    call_flat(MOE[1], flat)
    args, kw = small("moe_mxfp8_grouped_gemm")
    rejects("type", lambda: mxgemm.moe_mxfp8_grouped_gemm(*args, **{**kw, "block_m": True}))
