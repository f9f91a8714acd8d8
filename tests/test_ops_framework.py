"""The op framework (mxgemm/ops/_op.py): every public op is built on it, is explainable (kernel,
config and backend), runs its guards in the fake impl too, and is covered by `bench dispatch`."""
import pytest
import torch

import mxgemm
from mxgemm import guards, specs
from mxgemm.ops._op import OPS
from mxgemm.tools.bench import dispatch_calls

PUBLIC = tuple(OPS)


def test_every_framework_op_has_a_spec_and_is_benchmarked():
    assert set(OPS) == set(dispatch_calls()) <= {op for s in specs.SPECS for op in s.ops}
    for name in PUBLIC:
        assert getattr(mxgemm, name) is OPS[name] and OPS[name].__doc__
    for s in specs.SPECS:    # every spec op is public (the autograd op too, outside the framework)
        assert all(callable(getattr(mxgemm, op)) for op in s.ops), s.name


@pytest.mark.parametrize("name", PUBLIC)
def test_explain_names_kernel_and_backend(name):
    fn, _ = dispatch_calls()[name]
    plan = fn()
    assert plan.kernel and plan.backend == "emu" and plan.arch == "gfx950"
    assert f"kernel {plan.kernel}" in str(plan) and "on backend emu (gfx950)" in str(plan)


@pytest.mark.parametrize("name", PUBLIC)
def test_fake_impl_runs_the_guards(name):
    """Under FakeTensorMode only the fake impl runs: a bad dtype must still raise GuardError."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, _ = dispatch_calls()[name]
    flat = list(fn.args[0])
    op = OPS[name]
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in flat]
        fake[0] = torch.empty(fake[0].shape, dtype=torch.float16)
        n = op.n_positional
        with pytest.raises(guards.GuardError, match=r"\[dtype\]"):
            op(*fake[:n], **dict(zip(op.names[n:], fake[n:])))


def test_plan_cache_key_tells_apart_what_guards_read():
    op = OPS["mxfp8_dequantize"]
    x, s = torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8)
    base = op._key([x, s, None, "hip"])
    for other in ([x[:1], s, None, "hip"], [x.view(torch.float8_e4m3fn), s, None, "hip"],
                  [x.to("meta"), s, None, "hip"], [torch.zeros(64, 2, dtype=torch.uint8).t(), s, None, "hip"],
                  [x, s, torch.zeros(2, 64), "hip"], [x, s, None, "flydsl"]):
        assert op._key(other) != base
    assert op._key([x.clone(), s.clone(), None, "hip"]) == base


def test_recent_plan_fast_path_never_returns_another_calls_plan():
    """The cached path (recent plans checked by torch's C++ tensor guard) tells calls apart by
    shape, dtype, strides, optional tensors and the other arguments, like the planner would;
    a tensor passed twice, which that guard cannot check, takes the Python-key path."""
    from mxgemm.ops._op import RECENT_PLANS
    op = OPS["mxfp8_dequantize"]
    op.clear_plans()
    u8 = lambda *s: torch.zeros(*s, dtype=torch.uint8)  # noqa: E731
    calls = [[u8(2, 64), u8(2, 2), None, "hip"], [u8(1, 64), u8(1, 2), None, "hip"],
             [u8(2, 128), u8(2, 4), None, "hip"], [u8(2, 64).view(torch.float8_e4m3fn), u8(2, 2), None, "hip"],
             [u8(2, 64), u8(2, 2), torch.zeros(2, 64), "hip"], [u8(2, 64), u8(2, 2), None, "flydsl"]]
    plans = [op.plan(c) for c in calls]
    assert len(op._recent) == len(calls) and len(set(map(id, plans))) == len(calls)
    for c, p in zip(calls, plans):   # again, with fresh tensors, once every other call is recent too
        assert op.plan([v.clone() if isinstance(v, torch.Tensor) else v for v in c]) is p
    with pytest.raises(guards.GuardError, match=r"\[contiguity\]"):   # same shape, transposed strides
        op.plan([u8(64, 2).t(), u8(2, 2), None, "hip"])
    for m in range(1, 2 * RECENT_PLANS):
        op.plan([u8(m, 64), u8(m, 2), None, "hip"])
    assert len(op._recent) == RECENT_PLANS
    grouped = OPS["grouped_gemm_fp8_kernel"]
    grouped.clear_plans()
    flat = list(dispatch_calls()["grouped_gemm_fp8_kernel"][0].args[0])
    flat[1] = flat[3] = torch.ones(1)   # one scale tensor for both operands
    assert grouped.plan(flat) is grouped.plan(flat) and not grouped._recent


def test_registry_argument_order_matches_each_kernels_metadata():
    """Kernel.args (what the framework packs, by name) has one name per explicit argument of
    the compiled kernel: op tensors exactly at the pointer slots, scalars at by-value slots."""
    from mxgemm import build, launcher, registry
    tensor_names = {op.names[i] for op in OPS.values() for i in op.tensors}
    for k in registry.KERNELS.values():
        slots, _ = launcher.layout(build.artifact(k.name, k.variants[0], "gfx950"))
        kinds = [kind for _, _, kind in slots if not kind.startswith("hidden_")]
        assert len(kinds) == len(k.args), k.name
        assert [kind == "global_buffer" for kind in kinds] == [n in tensor_names for n in k.args], k.name


def test_ops_trace_under_torch_compile_fullgraph():
    """Dynamo traces the op's call down to its torch.library op (functional and out= forms) and
    the compiled call gives the eager result."""
    from mxgemm.quant import quantize_mx
    a, sa = quantize_mx(torch.randn(4, 256, generator=torch.Generator().manual_seed(0)), "e4m3")
    b, sb = quantize_mx(torch.randn(64, 256, generator=torch.Generator().manual_seed(1)), "e4m3")
    want = mxgemm.smallm_mxfp8_gemm(a, sa, b, sb)
    f = torch.compile(lambda a, sa, b, sb: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb) * 2, fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(a, sa, b, sb), want * 2)
    out = torch.empty_like(want)
    g = torch.compile(lambda a, sa, b, sb, out: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, out=out), fullgraph=True,
                      backend="aot_eager")
    g(a, sa, b, sb, out)
    assert torch.equal(out, want)


@pytest.mark.parametrize("name", [n for n in PUBLIC if "config" in OPS[n].names])
def test_one_config_grammar(name):
    """Every op's config is 'KEY=value,...' (or a dict) with per-op keys, and the errors read alike."""
    call = specs.decode_calls()[name]
    for bad, why in (("NOPE=1", "has unknown key 'NOPE'"), ("BM", "'BM' has a part without '='")):
        with pytest.raises(guards.GuardError, match=rf"\[config\] \w+: config {why}; expected 'KEY=value,\.\.\.' "
                                                    r"or a dict with (all of|keys from): \w+ \((int|str)\)"):
            mxgemm.explain(name, *call.args, **{**call.kw, "config": bad})
