"""Make the in-tree package importable when it is not installed, here and in subprocesses."""
import os
import sys

_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if _PY not in sys.path:
    sys.path.insert(0, _PY)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_PY, os.environ.get("PYTHONPATH")]))
