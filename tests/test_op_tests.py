"""The op_tests/ scripts cannot rot: each runs its small emulator case here, and every row of the
shipped tuned-config CSV (heuristic or measured) is a valid, buildable config the dispatcher takes."""
import csv
import subprocess
import sys
import types
from pathlib import Path

import torch

from mxgemm import registry
from mxgemm.guards import GuardError

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


def test_deep_gemm_emulator_cases_pass():
    out = _run(ROOT / "op_tests" / "test_deep_gemm.py", "--emulator")  # contiguous fp32, masked packed UE8M0
    cases = [l for l in out.splitlines() if "on the emulator:" in l]
    assert len(cases) == 2 and all(": ok: 0 of " in l for l in cases), out


def test_moe_gemm2_a4w4_emulator_case_passes():
    out = _run(ROOT / "op_tests" / "test_moe_gemm2_a4w4.py", "--emulator")  # asserts HIP == FlyDSL
    assert "hip vs flydsl: bit-identical" in out, out


def test_mx_gemm_emulator_cases_pass():
    out = _run(ROOT / "op_tests" / "test_mx_gemm.py", "--emulator")
    cases = [l for l in out.splitlines() if "on the emulator:" in l]
    assert len(cases) == 4 and all(": ok: max 0 ulp, 100.00% bit-exact" in l for l in cases), out
    assert sum("shuffled scales" in l for l in cases) == 1, out


CSV_HEADER = ["arch", "M", "N", "K", "kernel", "M_TILE", "N_SUB", "SPLIT_K", "K_LANES", "BM", "BN", "us", "source",
              "runner_up", "runner_up_us", "peer_us"]
SHIPPED_CSV = ROOT / "python" / "mxgemm" / "configs" / "smallm_mxfp8_gfx950.csv"


def csv_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def row_variant(r) -> dict:
    """A row's registered variant: its non-blank parameter columns as ints (an mx_gemm row's tile
    resolved to its variant by the op)."""
    from mxgemm.ops import smallm_mxfp8 as op
    return op.choice_of(r["kernel"], {p: int(r[p]) for p in CSV_HEADER[5:11] if r[p] != ""}, "").variant


def csv_problems(path) -> list[str]:
    """Why a tuned-config CSV is not usable: schema, registered kernel / variant / arch, shapes."""
    header, rows = csv_rows(path)
    if header != CSV_HEADER:
        return [f"header {header} != {CSV_HEADER}"]
    bad, seen = [], set()
    for n, r in enumerate(rows, 2):
        where = f"line {n}"
        try:
            M, N, K = (int(r[d]) for d in "MNK")
        except ValueError:
            bad.append(f"{where}: M, N, K must be integers")
            continue
        if min(M, N, K) <= 0 or K % 32:
            bad.append(f"{where}: shape {M}x{N}x{K} (positive, K a multiple of the MX block 32)")
        if (r["arch"], M, N, K) in seen:
            bad.append(f"{where}: duplicate shape {M}x{N}x{K}")
        seen.add((r["arch"], M, N, K))
        kernel = registry.KERNELS.get(r["kernel"])
        if kernel is None:
            bad.append(f"{where}: unregistered kernel {r['kernel']!r}")
            continue
        if r["arch"] not in kernel.archs:
            bad.append(f"{where}: {kernel.name} is not built for {r['arch']}")
        try:
            if row_variant(r) not in kernel.variants:
                bad.append(f"{where}: {kernel.name} has no variant {row_variant(r)}")
        except GuardError as e:
            bad.append(f"{where}: {e}")
        timed = r["source"] in ("measured", "simulated")
        if r["source"] not in ("heuristic", "measured", "simulated") or timed != (r["us"] != ""):
            bad.append(f"{where}: source {r['source']!r} with us {r['us']!r} (measured rows carry their time)")
        elif (r["source"] == "simulated") != (r["peer_us"] != ""):
            bad.append(f"{where}: source {r['source']!r} with peer_us {r['peer_us']!r} (simulated rows carry the peer's)")
        elif r["us"] and not float(r["us"]) > 0:
            bad.append(f"{where}: us {r['us']} must be positive")
    return bad


def test_shipped_config_csv_rows_are_valid_buildable_configs():
    from mxgemm import build
    from mxgemm.ops import smallm_mxfp8 as op
    assert csv_problems(SHIPPED_CSV) == []
    _, rows = csv_rows(SHIPPED_CSV)
    assert rows
    for r in rows:   # the dispatcher takes every row for its own shape (its kernel's M / K envelope)
        M, N, K = (int(r[d]) for d in "MNK")
        choice = op.tuned_config(M, N, K, r["arch"])
        assert (choice.kernel, choice.variant) == (r["kernel"], row_variant(r)), r
        assert build.artifact(r["kernel"], row_variant(r), r["arch"]).hsaco_path.exists()   # memoised


def test_config_csv_check_rejects_broken_rows(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(CSV_HEADER) + "\n"
                   "gfx950,4,1280,8192,smallm_mxfp8_gemv,4,1,,,,,,heuristic,,,\n"
                   "gfx950,4,1280,8192,smallm_mxfp8_gemv,4,1,,,,,,heuristic,,,\n"
                   "gfx950,8,1280,8200,nosuch,16,,4,,,,,heuristic,,,\n"
                   "gfx1250,8,1280,8192,smallm_mxfp8_mfma,16,,3,,,,,heuristic,,,\n"
                   "gfx950,16,1280,8192,smallm_mxfp8_mfma,16,,4,,,,,measured,,,\n"
                   "gfx950,32,1280,8192,smallm_mxfp8_mfma,32,,4,,,,3.5,simulated,,,\n"
                   "gfx950,64,1280,8192,mx_gemm,,,,,48,64,,heuristic,,,\n")
    assert csv_problems(bad) == [
        "line 3: duplicate shape 4x1280x8192",
        "line 4: shape 8x1280x8200 (positive, K a multiple of the MX block 32)",
        "line 4: unregistered kernel 'nosuch'",
        "line 5: smallm_mxfp8_mfma is not built for gfx1250",
        "line 5: smallm_mxfp8_mfma has no variant {'M_TILE': 16, 'SPLIT_K': 3}",
        "line 6: source 'measured' with us '' (measured rows carry their time)",
        "line 7: source 'simulated' with peer_us '' (simulated rows carry the peer's)",
        "line 8: [config] no gfx950 mx_gemm variant e4m3 x e4m3 -> bf16 with SPLITS=1 and tile 48x64; registered "
        "tiles: [(64, 64), (128, 128), (256, 128)]"]
    (tmp_path / "renamed.csv").write_text(SHIPPED_CSV.read_text().replace("SPLIT_K", "SPLITK", 1))
    assert csv_problems(tmp_path / "renamed.csv")[0].startswith("header ")


def test_grouped_gemm_fp8_emulator_cases_pass():
    out = _run(ROOT / "op_tests" / "test_grouped_gemm_fp8.py", "--emulator")
    cases = [l for l in out.splitlines() if "on the emulator:" in l]
    assert len(cases) == 3 and all(": ok: bit-exact" in l for l in cases), out
    assert {l.split()[0] for l in cases} == {"NT", "NN", "TN"}, out


def _grouped_config_problems(rows) -> list[str]:
    """Why rows of a grouped_gemm_fp8 tuned table are unusable: duplicates, unregistered tiles, values."""
    from mxgemm.ops import train_grouped_gemm as op
    bad, seen = [], set()
    for n, r in enumerate(rows, 2):
        key = op.problem_key(r["layout"], *(int(r[k]) for k in op.KEY[1:]))
        cfg = {k: int(r[k]) for k in op.CONFIG}
        if key in seen:
            bad.append(f"line {n}: duplicate problem {key}")
        seen.add(key)
        if op._variant(r["layout"], torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16, cfg) is None:
            bad.append(f"line {n}: no registered {r['layout']} e4m3 -> bf16 tile {cfg['BM']} x {cfg['BN']}")
        if cfg["GROUP_M"] not in op.GROUP_MS or cfg["PERSISTENT"] not in op.PERSISTENT:
            bad.append(f"line {n}: GROUP_M {cfg['GROUP_M']} / PERSISTENT {cfg['PERSISTENT']}")
        if (r["source"] == "heuristic") != (r["us"] == ""):
            bad.append(f"line {n}: source {r['source']!r} with us {r['us']!r}")
    return bad


def _planner_takes(rows, table):
    from mxgemm.ops import train_grouped_gemm as op
    e4m3 = torch.empty(0, dtype=torch.float8_e4m3fn)
    call = types.SimpleNamespace(config="", a=e4m3, b=e4m3, out_dtype=torch.bfloat16, accumulate=False)
    for r in rows:
        key = op.problem_key(r["layout"], *(int(r[k]) for k in op.KEY[1:]))
        choice = op.choose_config(call, *key, table=table)
        picked = {"BM": choice.variant["BM"], "BN": choice.variant["BN"], **choice.options}
        assert picked == {k: int(r[k]) for k in op.CONFIG}, r
        assert choice.why == f"tuned table row (source={r['source']})", r


def test_grouped_gemm_fp8_tuner_dry_run_writes_a_table_the_planner_reads(tmp_path):
    from mxgemm import tuned
    from mxgemm.ops import train_grouped_gemm as op
    out = _run(ROOT / "op_tests" / "tune_grouped_gemm_fp8.py", "--emulator", "--out", tmp_path / "t.csv")
    assert "every candidate bit-exact vs reference" in out, out
    header, rows = csv_rows(tmp_path / "t.csv")
    assert header == list(op.CSV_FIELDS) and [r["layout"] for r in rows] == ["NT", "NN", "TN"]
    assert _grouped_config_problems(rows) == [] and all(r["source"] == "emulator" for r in rows)
    _planner_takes(rows, op.tuned_table(str(tmp_path / "t.csv")))
    assert tuned.read_rows(tmp_path / "none.csv") == []


def test_shipped_grouped_gemm_fp8_table_rows_are_taken_by_the_planner():
    from mxgemm.ops import train_grouped_gemm as op
    header, rows = csv_rows(op.CONFIG_CSV)
    assert header == list(op.CSV_FIELDS) and rows
    assert _grouped_config_problems(rows) == []
    _planner_takes(rows, op.tuned_table())
    broken = [{**rows[0], "BM": "128", "BN": "64"}, rows[0], {**rows[1], "source": "measured"}]
    assert _grouped_config_problems(broken) == [
        f"line 2: no registered {rows[0]['layout']} e4m3 -> bf16 tile 128 x 64",
        f"line 3: duplicate problem {op.problem_key(rows[0]['layout'], *(int(rows[0][k]) for k in op.KEY[1:]))}",
        "line 4: source 'measured' with us ''"]
