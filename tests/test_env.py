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
    monkeypatch.setenv("MXGEMM_EMU_ARCH", "gfx9")
    with pytest.raises(env.EnvError, match=r"MXGEMM_EMU_ARCH='gfx9': must be one of gfx950, gfx1250"):
        env.get("MXGEMM_EMU_ARCH")
    monkeypatch.setenv("MXGEMM_EMU_ARCH", "")
    assert env.get("MXGEMM_EMU_ARCH") == "gfx950"


def test_cache_dir_that_is_not_a_directory_names_the_variable(tmp_path, monkeypatch):
    from mxgemm import toolchain
    regular = tmp_path / "a_file"
    regular.write_text("")
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(regular))
    with pytest.raises(env.EnvError, match=re.escape(f"MXGEMM_CACHE_DIR='{regular}': not a directory (where ")):
        toolchain.cache_dir()
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(regular / "sub"))
    with pytest.raises(env.EnvError, match=re.escape(f"MXGEMM_CACHE_DIR='{regular / 'sub'}': cannot be created: "
                                                     f"{regular} is not a directory (where ")):
        toolchain.cache_dir()
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert toolchain.cache_dir() == str(tmp_path / "new" / "cache") and (tmp_path / "new" / "cache").is_dir()


def test_cache_dir_that_is_read_only_names_the_variable(read_only_dir, monkeypatch):
    from mxgemm import toolchain
    read_only = read_only_dir
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(read_only))
    with pytest.raises(env.EnvError, match=re.escape(f"MXGEMM_CACHE_DIR='{read_only}': not writable (where ")):
        toolchain.cache_dir()
    monkeypatch.setenv("MXGEMM_CACHE_DIR", str(read_only / "sub"))
    with pytest.raises(env.EnvError, match=re.escape(f"MXGEMM_CACHE_DIR='{read_only / 'sub'}': cannot be created: "
                                                     f"{read_only} is not writable (where ")):
        toolchain.cache_dir()
