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
