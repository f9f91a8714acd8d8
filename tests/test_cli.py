"""python -m mxgemm: help without a command, one-line errors for bad names, build -v labels."""
import os
import re
import subprocess
import sys
from pathlib import Path

from mxgemm import registry
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
