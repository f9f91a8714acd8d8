"""The repository passes its linter (ruff, configured in pyproject.toml) with no finding."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed (requirements.txt pins it)"
    p = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
