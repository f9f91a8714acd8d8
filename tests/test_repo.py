"""The README's two commands are the ones CI and users run; citations point into docs/."""
import re
import subprocess
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
    assert "compiler      gfx950" in p.stdout and "running demos on backend: emu" in p.stdout
    from mxgemm import specs
    smokes = {s.name: [smoke.label for smoke in s.smoke("cpu")] for s in specs.SPECS}
    assert all(smokes.values()), smokes                  # every spec has a smoke check
    labels = [label for ls in smokes.values() for label in ls]
    for label in labels:
        assert f"  {label}: ok: " in p.stdout, label
    for both_kernels in ("moe_gemm2_a4w4[hip]", "moe_gemm2_a4w4[flydsl]", "mxfp8_dequantize[flydsl] 8x64",
                         "mx_gemm gfx1250 MXFP8"):
        assert any(label.startswith(both_kernels) for label in labels)


def test_dispatch_bench_prints_numbers():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "mxgemm", "bench", "dispatch"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "smallm_mxfp8_gemm dispatch" in p.stdout and "moe_gemm2_a4w4 dispatch" in p.stdout


# Code cites hardware and toolchain facts as `docs/<file>.md §N[.M]`; the files must be in the
# repository's docs/ and carry those sections. Background notes outside the repository must not
# be cited at all.
_CITATION = re.compile(r"docs/([\w.-]+\.md)(?:\s*§\s*(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?)?")
_OUTSIDE = re.compile(r"\b(MFMA_FACTS|ARCHITECTURE\.md|TOOLCHAIN\.md)")


def _doc_sections(name):
    path = ROOT / "docs" / name
    if not path.is_file():
        return None
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", path.read_text(), re.M)}


def citation_problems(text: str) -> list[str]:
    bad = [f"cites {m.group(1)}, which is not in the repository" for m in _OUTSIDE.finditer(text)]
    for m in _CITATION.finditer(text):
        sections = _doc_sections(m.group(1))
        if sections is None:
            bad.append(f"cites docs/{m.group(1)}, which does not exist")
        else:
            bad += [f"cites docs/{m.group(1)} §{s}, which has no such section"
                    for s in m.groups()[1:] if s and s not in sections]
    return bad


def test_citations_point_into_the_repository_docs():
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    problems = {}
    for f in files:
        if f == "tests/test_repo.py" or not (ROOT / f).is_file():
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:
            continue
        if citation_problems(text):
            problems[f] = citation_problems(text)
    assert problems == {}
    cited = {m.group(1) for f in files if f.startswith(("python/", "csrc/", "tests/"))
             for m in _CITATION.finditer((ROOT / f).read_text(errors="replace"))}
    assert {"gfx950_isa.md", "toolchain.md"} <= cited


def test_citation_check_catches_bad_citations():
    assert citation_problems("see docs/gfx950_isa.md §1.5 and docs/toolchain.md §2") == []
    assert citation_problems("layout (MFMA_FACTS §1); docs/nosuch.md; docs/gfx950_isa.md §1.9-12") == [
        "cites MFMA_FACTS, which is not in the repository", "cites docs/nosuch.md, which does not exist",
        "cites docs/gfx950_isa.md §1.9, which has no such section",
        "cites docs/gfx950_isa.md §12, which has no such section"]
