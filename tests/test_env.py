"""The environment variables: one table (mxgemm.env), read through it, listed in the README."""
import re
from pathlib import Path

import pytest

import mxgemm
from mxgemm import env

ROOT = Path(__file__).resolve().parents[1]


def test_readme_lists_exactly_the_registered_variables():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `(MXGEMM_\w+)` \|", readme, re.M))
    assert listed == set(env.VARS)


def test_the_package_reads_only_registered_variables():
    """Every MXGEMM_ name in the package's code is registered."""
    pkg = Path(mxgemm.__file__).parent
    used = {m for p in pkg.rglob("*.py") for m in re.findall(r"\bMXGEMM_[A-Z0-9_]+\b", p.read_text())}
    unknown = used - set(env.VARS) - {"MXGEMM_HIP_KERNELS", "MXGEMM_HIP_FLAGS", "MXGEMM_KERNEL"}  # CMake names
    assert not unknown


def test_value_outside_the_choices_names_the_variable(monkeypatch):
    monkeypatch.setenv("MXGEMM_VALIDATE", "yes")
    with pytest.raises(env.EnvError, match=r"MXGEMM_VALIDATE='yes': must be one of 0, 1"):
        env.get("MXGEMM_VALIDATE")
    monkeypatch.setenv("MXGEMM_VALIDATE", "")
    assert env.get("MXGEMM_VALIDATE") == "0"
