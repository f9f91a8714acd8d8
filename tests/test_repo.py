"""The README's two commands are the ones CI and users run."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    return [l.strip() for l in (ROOT / "README.md").read_text().splitlines()
            if l.startswith("    pip install")]


def test_readme_has_demo_and_test_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2 and cmds[0].endswith("python -m mxgemm demo") and "pytest" in cmds[1]


def test_ci_runs_exactly_the_readme_test_command():
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.startswith("#") and not l.startswith(("set ", "cd "))]
    assert ci == [_readme_commands()[1]]


def test_demo_runs_and_matches_reference():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "mxgemm", "demo"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for what in ("compiler      gfx950", "backend", "smallm_mxfp8_gemv", "moe_gemm2_a4w4 hip vs flydsl: bit-identical",
                 "mxfp8_dequantize[flydsl] 8x64: bit-exact", "moe_mxfp8_grouped_gemm"):
        assert what in p.stdout, what


def test_dispatch_bench_prints_numbers():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "mxgemm", "bench", "dispatch"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "smallm_mxfp8_gemm dispatch" in p.stdout and "moe_gemm2_a4w4 dispatch" in p.stdout
