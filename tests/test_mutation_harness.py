"""The mutation harness (python -m mxgemm.tools mutate): every catalogue entry still applies
to the current sources (a refactor that moves a snippet must re-point the entry, not disable
it), every gfx950 kernel has kernel tests and at least one mutation, and a small sample runs
end to end and is caught. The full run is manual: python -m mxgemm.tools mutate."""
import subprocess
import sys
from pathlib import Path

import pytest

from mxgemm import registry
from mxgemm.tools import mutate
from mxgemm.tools.mutations import ALL, CATALOGUE, KERNEL_TESTS, Mutation

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("m", CATALOGUE, ids=[m.name for m in CATALOGUE])
def test_catalogue_entry_applies_exactly_once(m, tmp_path):
    for rel, _, _ in m.edits:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    mutate.apply(m, tmp_path)
    for rel, _, _ in m.edits:
        if rel.endswith(".py"):
            compile((tmp_path / rel).read_text(), rel, "exec")
    assert all(t in {x for ts in KERNEL_TESTS.values() for x in ts} for t in m.tests())


def test_missing_snippet_is_a_harness_error(tmp_path):
    (tmp_path / "f.hip").write_text("a + b\n")
    with pytest.raises(mutate.SnippetError, match="found 0 times"):
        mutate.apply(Mutation("gone", ALL, (("f.hip", "a - b", "a + b"),), "moved"), tmp_path)


def test_every_gfx950_kernel_has_tests_and_mutations():
    kernels = {k for k, spec in registry.KERNELS.items() if "gfx950" in spec.archs}
    assert kernels <= set(KERNEL_TESTS)
    targeted = {k for m in CATALOGUE if m.kernels != ALL for k in m.kernels}
    assert kernels <= targeted, f"kernels without a mutation: {sorted(kernels - targeted)}"
    assert all((ROOT / t).is_file() for ts in KERNEL_TESTS.values() for t in ts)


def test_sample_run_catches_its_mutations():
    p = subprocess.run([sys.executable, "-m", "mxgemm.tools", "mutate",
                        "--name", "dequant-hip-drop-scale,dequant-flydsl-drop-scale"],
                       capture_output=True, text=True, cwd=ROOT, env={**__import__("os").environ,
                                                                     "PYTHONPATH": str(ROOT / "python")})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("caught by tests/test_mxfp8_dequantize.py::") == 2, p.stdout
