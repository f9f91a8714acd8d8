"""Regenerate the emulator coverage report's instruction forms (``mxgemm/emu/data/mc_forms_<arch>.txt``)
from LLVM's AMDGPU assembler tests:

    python -m mxgemm.tools.mc_forms LLVM_DIR [--arch gfx950,gfx1250] [--source TEXT] [--out DIR]

LLVM_DIR holds llvm-project's ``llvm/test/MC/AMDGPU/*.s`` (or any subset of them). A file counts for
an arch when one of its RUN lines runs ``llvm-mc`` (not under ``not``) with that ``-mcpu`` (gfx1250:
also gfx12xx). Its instruction lines are assembled with the project's toolchain for the arch
(``mxgemm.toolchain``: clang's integrated assembler, ``-mcpu=<arch>``); only the lines it accepts are
kept. A form is a mnemonic with its encoding suffix stripped (``emu.isa.base_mnemonic``); the file
keeps the first accepted line of each form as its example. Each ``--source`` (e.g. the
llvm-project commit) is a header line, beside the list of files read.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..emu.isa import base_mnemonic

ARCHS = ("gfx950", "gfx1250")
DATA = Path(__file__).resolve().parents[1] / "emu" / "data"
_RUN = re.compile(r"^\s*(?://|;)\s*RUN:(.*)$")
_MCPU = {"gfx950": re.compile(r"-mcpu=gfx950\b"), "gfx1250": re.compile(r"-mcpu=gfx12\d\d\b")}
_MNEMONIC = re.compile(r"^[a-z][a-z0-9_]*$")
_ERROR = re.compile(r"^[^:\n]*:(\d+):\d+: error:", re.M)


def data_path(arch: str) -> Path:
    return DATA / f"mc_forms_{arch}.txt"


def _strip(line: str) -> str:
    for c in ("//", ";"):
        i = line.find(c)
        if i >= 0:
            line = line[:i]
    return line.strip()


def runs_for(text: str, arch: str) -> bool:
    """Some RUN line of the file assembles it for ``arch`` (an expected-failure ``not`` run does not count)."""
    for m in (_RUN.match(line) for line in text.splitlines()):
        if m and not m.group(1).lstrip().startswith("not") and "llvm-mc" in m.group(1) \
                and _MCPU[arch].search(m.group(1)):
            return True
    return False


def candidates(text: str):
    """Instruction lines of a test file: (mnemonic, line), comments, labels and directives dropped."""
    for line in text.splitlines():
        s = _strip(line)
        if not s or s.startswith(".") or s.endswith(":"):
            continue
        m = s.split(None, 1)[0]
        if _MNEMONIC.match(m):
            yield m, s


def accepted(lines: list[str], arch: str) -> list[bool]:
    """Which lines the project's assembler accepts for ``arch`` (one assembly of all of them;
    the rejected ones are the lines it reports errors on)."""
    from ..toolchain import find_compiler
    comp = find_compiler(arch)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "forms.s"
        src.write_text("".join(f"{s}\n" for s in lines))
        p = subprocess.run([*comp.clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}",
                            "-c", str(src), "-o", str(Path(d) / "forms.o")], capture_output=True, text=True)
    bad = {int(n) for n in _ERROR.findall(p.stderr)}
    if p.returncode and not bad:
        raise RuntimeError(f"assembler failed without a line error:\n{p.stderr[-2000:]}")
    return [i + 1 not in bad for i in range(len(lines))]


def forms(llvm_dir: Path, arch: str, per_form: int = 4):
    """-> (files read, [(form, example line, file)]): up to ``per_form`` candidate lines per form
    are assembled, the first accepted one is the example."""
    files = sorted(p for p in llvm_dir.glob("*.s") if runs_for(p.read_text(errors="replace"), arch))
    cands = {}
    for f in files:
        for m, s in candidates(f.read_text(errors="replace")):
            got = cands.setdefault(base_mnemonic(m), [])
            if len(got) < per_form and s not in (x for x, _ in got):
                got.append((s, f.name))
    flat = [(form, s, name) for form, got in cands.items() for s, name in got]
    ok = accepted([s for _, s, _ in flat], arch)
    out = {}
    for (form, s, name), good in zip(flat, ok):
        if good and form not in out:
            out[form] = (s, name)
    return [f.name for f in files], sorted((form, s, name) for form, (s, name) in out.items())


def write(arch: str, files: list[str], rows, sources: list[str], out_dir: Path) -> Path:
    from ..toolchain import find_compiler
    comp = find_compiler(arch)
    head = [f"# Instruction forms of LLVM's AMDGPU assembler tests (llvm/test/MC/AMDGPU) accepted for {arch}",
            "# by the project's assembler; one line per form: form<TAB>example<TAB>test file.",
            "# LLVM test files: Apache-2.0 WITH LLVM-exception.",
            *(f"# Source: {s}" for s in sources or ["unstated"]),
            f"# Assembler: {comp.kind} clang {comp.version}",
            f"# Files ({len(files)}): {' '.join(files)}",
            f"# Regenerate: python -m mxgemm.tools.mc_forms LLVM_DIR --arch {arch} --source '...'"]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mc_forms_{arch}.txt"
    path.write_text("\n".join(head + [f"{f}\t{s}\t{n}" for f, s, n in rows]) + "\n")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mxgemm.tools.mc_forms", description=__doc__.split("\n\n")[0])
    ap.add_argument("llvm_dir", type=Path, help="directory of LLVM's llvm/test/MC/AMDGPU/*.s files")
    ap.add_argument("--arch", default=",".join(ARCHS))
    ap.add_argument("--source", action="append", default=[],
                    help="where the files came from (e.g. the llvm-project commit); repeatable, one header line each")
    ap.add_argument("--out", type=Path, default=DATA)
    a = ap.parse_args(argv)
    for arch in a.arch.split(","):
        if arch not in ARCHS:
            ap.error(f"--arch {arch!r}: one of {', '.join(ARCHS)}")
        files, rows = forms(a.llvm_dir, arch)
        path = write(arch, files, rows, a.source, a.out)
        print(f"{arch}: {len(rows)} forms from {len(files)} files -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
