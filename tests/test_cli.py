"""python -m mxgemm: help without a command, one-line errors for bad names and unusable environment
variables, build -v labels, what info reports."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mxgemm import registry, toolchain
from mxgemm.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m mxgemm") and all(c in out for c in ("info", "build", "demo", "bench"))


def test_unknown_kernel_is_one_line_listing_the_registry():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))   # this tree's package, not an installed one
    p = subprocess.run([sys.executable, "-m", "mxgemm", "build", "--kernel", "nosuch"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("python -m mxgemm build: error: unknown kernel 'nosuch'; registered kernels: ")
    assert all(name in p.stderr for name in registry.KERNELS)


def test_arch_no_kernel_supports_is_an_error(capsys):
    assert main(["build", "--arch", "gfx942"]) == 1
    err = capsys.readouterr().err
    assert err == "python -m mxgemm build: error: no selected kernel is built for arch gfx942; supported: gfx1250, gfx950\n"
    assert main(["build", "--kernel", "smallm_mxfp8_gemv", "--arch", "gfx1250"]) == 1
    assert "arch gfx1250; supported: gfx950" in capsys.readouterr().err


def test_verbose_build_labels_variants_by_registry_name(capsys):
    assert main(["build", "-v", "--kernel", "mxfp8_dequant,mxfp8_dequant_flydsl", "--arch", "gfx950"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split()[:4] for l in lines[:-1]] == [["mxfp8_dequant", "hip", "base", "mxfp8_dequant"],
                                                   ["mxfp8_dequant_flydsl", "flydsl", "base", "mxfp8_dequant"]]
    assert re.fullmatch(r"2 artefacts of 2 kernels ready: \d compiled, \d cached, \d+\.\d\d s", lines[-1]), lines[-1]


def test_info_lists_every_emulator_target(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "emulator      gfx950: wave64, 160 KiB LDS" in out
    assert "emulator      gfx1250: wave32, 320 KiB LDS, wait counters load/store/ds/km/tensor" in out


def _cli(*argv, **env_vars):
    """Run python -m mxgemm in a fresh process, this tree's package, MXGEMM_BACKEND/HIP_LIB unset unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("MXGEMM_BACKEND", "MXGEMM_HIP_LIB")}
    env.update(env_vars, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "mxgemm", *argv], capture_output=True, text=True, cwd=ROOT, env=env)


@pytest.mark.parametrize("argv, var, value, problem", [
    (["info"], "MXGEMM_BACKEND", "bogus", "must be one of emu, hip"),
    (["demo"], "MXGEMM_BACKEND", "bogus", "must be one of emu, hip"),
    (["build", "--kernel", "mxfp8_dequant"], "MXGEMM_COMPILER", "bogus", "must be one of rocm, ziglang"),
    (["build", "--kernel", "mxfp8_dequant"], "MXGEMM_CACHE_DIR", str(ROOT / "README.md"), "not a directory"),
], ids=["info-backend", "demo-backend", "build-compiler", "build-cache_dir"])
def test_unusable_variable_is_one_line_naming_it(argv, var, value, problem):
    p = _cli(*argv, **{var: value})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"python -m mxgemm {argv[0]}: error: {var}={value!r}: {problem} ("), p.stderr


@pytest.mark.skipif(toolchain.gpu_arch() is not None, reason="this machine has a ROCm GPU")
def test_hip_forced_without_a_gpu_is_a_warning_in_info_and_one_error_in_demo():
    warning = "WARNING: MXGEMM_BACKEND=hip forces the hip backend, but no ROCm GPU / HIP runtime is found"
    p = _cli("info", MXGEMM_BACKEND="hip")
    assert p.returncode == 0 and "backend       hip" in p.stdout and warning in p.stdout, p.stdout
    p = _cli("info", MXGEMM_BACKEND="hip", MXGEMM_HIP_LIB="mock")   # the mock runtime needs no GPU
    assert p.returncode == 0 and "backend       hip" in p.stdout and "WARNING" not in p.stdout, p.stdout
    p = _cli("demo", MXGEMM_BACKEND="hip")
    assert p.returncode == 1 and "FAILED" not in p.stdout, p.stdout
    assert p.stderr.startswith(f"python -m mxgemm demo: error: {warning.removeprefix('WARNING: ')}")
    assert p.stderr.count("\n") == 1, p.stderr


@pytest.mark.skipif(toolchain.gpu_arch() is not None, reason="this machine has a ROCm GPU")
def test_demo_on_the_mock_hip_runtime_runs_cpu_tensors():
    p = _cli("demo", MXGEMM_BACKEND="hip", MXGEMM_HIP_LIB="mock")
    assert p.returncode == 0 and "running demos on backend: hip" in p.stdout, p.stdout + p.stderr
    assert "FAILED" not in p.stdout and "MISMATCH" not in p.stdout, p.stdout


def test_info_reports_an_unusable_cache_dir(tmp_path):
    path = tmp_path / "cache"
    path.write_text("")
    p = _cli("info", MXGEMM_CACHE_DIR=str(path))
    assert p.returncode == 0, p.stderr
    assert f"cache         UNUSABLE (MXGEMM_CACHE_DIR='{path}': not a directory (where " in p.stdout, p.stdout


def test_info_reports_a_read_only_cache_dir(read_only_dir, monkeypatch, capsys):
    """In this process: the fixture's read-only answer holds for root too."""
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(read_only_dir))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"cache         UNUSABLE (MXGEMM_CACHE_DIR='{read_only_dir}': not writable (where " in out, out
