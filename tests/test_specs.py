"""The op specs (mxgemm.specs) are the one place an op's facts live: every registered kernel and
every framework op belongs to exactly one spec, every file and function a spec names exists, the
README's table is the specs' own, and each spec's calls run the variant they claim."""
from pathlib import Path

import pytest
import torch

import mxgemm
from mxgemm import reference, registry, specs
from mxgemm.ops._op import OPS

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_and_op_belongs_to_one_spec():
    kernels = [k for s in specs.SPECS for k in s.kernels]
    ops = [o for s in specs.SPECS for o in s.ops]
    assert sorted(kernels) == sorted(registry.KERNELS) and len(set(ops)) == len(ops) and set(OPS) <= set(ops)
    assert not specs.gfx950_kernels_without_spec()


@pytest.mark.parametrize("spec", specs.SPECS, ids=lambda s: s.name)
def test_what_a_spec_names_exists(spec):
    assert (ROOT / "python" / "mxgemm" / "ops" / f"{spec.name}.py").is_file()
    for path in spec.tests + ((spec.hardware_script,) if spec.hardware_script else ()):
        assert (ROOT / path).is_file(), path
    assert all(callable(getattr(reference, f)) for f in spec.reference)
    assert all(callable(getattr(mxgemm, op)) for op in spec.ops)


def test_readme_table_is_the_specs():
    assert specs.readme_table() in (ROOT / "README.md").read_text(), \
        "README's op table is stale: paste mxgemm.specs.readme_table()"


def test_preset_names_are_unique_and_cases_name_spec_kernels():
    names = [n for s in specs.SPECS for n in s.presets]
    assert len(set(names)) == len(names) and specs.SMALL_PRESET not in names
    for case in specs.presets()[specs.SMALL_PRESET]():
        assert specs.spec_of_kernel(case.kernel)


def test_a_forced_variant_the_op_would_not_pick_is_refused():
    """Call.expect is the check every spec call and race call passes through."""
    c = specs.spec_of_op("mxfp8_dequantize").decode(specs.Inputs())["mxfp8_dequantize"]
    c.expect("mxfp8_dequant", {})
    with pytest.raises(ValueError, match="picks mxfp8_dequant"):
        c.expect("mxfp8_dequant_flydsl", {})


def test_inputs_fills():
    x, s = specs.Inputs("bytes", seed=3).mx(4, 64, fmt="e5m2")
    assert x.dtype == torch.float8_e5m2 and s.shape == (4, 2) and s.dtype == torch.uint8
    assert int(x.view(torch.uint8).max()) < 0x7C and 120 <= int(s.min()) and int(s.max()) < 134
    x, s = specs.Inputs("data").mx(2, 3, 64, fmt="e2m1")
    assert x.shape == (2, 3, 32) and s.shape == (2, 3, 2)
    assert torch.equal(specs.Inputs("bytes", seed=3).mx(4, 64, fmt="e5m2")[0].view(torch.uint8),
                       specs.Inputs("bytes", seed=3).mx(4, 64, fmt="e5m2")[0].view(torch.uint8))
    with pytest.raises(ValueError, match="fill must be"):
        specs.Inputs("zeros")


def test_contract_verdicts():
    one = torch.ones(4, dtype=torch.bfloat16)
    up = (one.view(torch.int16) + 1).view(torch.bfloat16)
    assert specs.Contract().check(one, one).startswith("ok")
    assert specs.Contract().check(up, one).startswith("MISMATCH")
    assert specs.Contract(ulp=1, exact=0.0).check(up, one).startswith("ok")
    assert specs.Contract(ulp=1, exact=0.5).check(torch.cat([up[:1], one[1:]]), one).startswith("ok")
    nan = torch.tensor([float("nan"), 1.0])
    assert specs.Contract().check(nan, nan.clone()).startswith("ok")
    assert specs.Contract().check(nan, torch.tensor([0.0, 1.0])).startswith("MISMATCH")


def test_build_v_names_the_deep_gemm_function_each_variant_serves():
    """The variant DeepGEMM's functions plan to is one its spec says serves them (build -v prints it)."""
    import mxgemm.deep_gemm as dg
    spec = specs.spec_of_kernel("blockscale_grouped_gemm")
    g, m, n, k = 2, 64, 128, 256
    e4 = lambda *s: torch.zeros(*s, dtype=torch.float8_e4m3fn)  # noqa: E731
    bf = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)  # noqa: E731
    masked = torch.tensor([m, 1], dtype=torch.int32)
    calls = {
        "m_grouped_fp8_gemm_nt_masked": ((e4(g, m, k), torch.ones(g, m, k // 128)), (e4(g, n, k), torch.ones(g, 1, 2)),
                                         bf(g, m, n), masked, m),
        "m_grouped_bf16_gemm_nt_masked": (bf(g, m, k), bf(g, n, k), bf(g, m, n), masked, m),
        "m_grouped_fp8_gemm_nt_contiguous": ((e4(g * m, k), torch.ones(g * m, k // 128)),
                                             (e4(g, n, k), torch.ones(g, 1, 2)), bf(g * m, n),
                                             torch.zeros(g * m, dtype=torch.int32)),
    }
    for fn, args in calls.items():
        plan = dg.explain(getattr(dg, fn), *args)
        assert fn in spec.served_by(plan.kernel, plan.variant), (fn, plan.variant)
    assert all(spec.served_by("blockscale_grouped_gemm", v) for v in registry.get("blockscale_grouped_gemm").variants)
