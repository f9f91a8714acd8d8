"""Make the in-tree package importable when it is not installed, here and in subprocesses."""
import os
import sys

_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if _PY not in sys.path:
    sys.path.insert(0, _PY)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_PY, os.environ.get("PYTHONPATH")]))


import pytest  # noqa: E402


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A directory this process cannot write to, also as root (who writes anywhere: os.access then
    answers for it as it would for any other user)."""
    path = tmp_path / "read_only"
    path.mkdir(mode=0o555)
    if os.access(path, os.W_OK):
        real_access = os.access
        monkeypatch.setattr(os, "access",
                            lambda p, mode: False if str(p) == str(path) and mode & os.W_OK else real_access(p, mode))
    return path
