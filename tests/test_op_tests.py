"""The op_tests/ scripts cannot rot: each runs its small emulator case here, and the shipped
tuned-config CSV is exactly what the tuner's documented heuristic writes."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    p = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, f"{args[0]} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def test_smallm_mxfp8_emulator_cases_pass():
    out = _run(ROOT / "op_tests" / "test_smallm_mxfp8.py", "--emulator")
    cases = [l for l in out.splitlines() if "on the emulator:" in l]
    assert len(cases) == 2 and all(": ok:" in l for l in cases), out


def test_moe_mxfp8_emulator_case_passes():
    out = _run(ROOT / "op_tests" / "test_moe_mxfp8.py", "--emulator")
    cases = [l for l in out.splitlines() if "on the emulator:" in l]
    assert len(cases) == 1 and ": ok:" in cases[0], out


def test_moe_gemm2_a4w4_emulator_case_passes():
    out = _run(ROOT / "op_tests" / "test_moe_gemm2_a4w4.py", "--emulator")  # asserts HIP == FlyDSL
    assert "hip vs flydsl: bit-identical" in out, out


def test_shipped_config_csv_is_the_heuristic(tmp_path):
    csv = tmp_path / "heuristic.csv"
    _run(ROOT / "op_tests" / "tune_smallm_mxfp8.py", "--heuristic", "--out", csv)
    shipped = ROOT / "python" / "mxgemm" / "configs" / "smallm_mxfp8_gfx950.csv"
    assert sorted(csv.read_text().splitlines()) == sorted(shipped.read_text().splitlines())
    assert all(",heuristic" in l for l in shipped.read_text().splitlines()[1:])
