"""pip install for mxgemm.

Install torch first and build without isolation (a build that imports torch must see the
user's torch, never pull a CUDA one into an isolated env):

    pip install -r requirements.txt && pip install --no-build-isolation -e .

After the Python files are in place, install runs the JIT warm-up (`python -m mxgemm build
--warm`): the host extension and every registered device kernel are compiled into the cache
(MXGEMM_CACHE_DIR or ~/.cache/mxgemm). If that fails (e.g. no compiler yet) install still
succeeds with a warning; first use builds anything missing.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("csrc", "flydsl_kernels")  # device sources the package compiles at run time


class build_py_and_warm(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            # Non-editable installs carry the device sources inside the package (mxgemm/_src).
            for d in SHIPPED:
                dst = Path(self.build_lib) / "mxgemm" / "_src" / d
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(ROOT / d, dst, ignore=shutil.ignore_patterns("__pycache__"))
        if os.environ.get("MXGEMM_SKIP_WARM"):
            return
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        cmd = [sys.executable, "-m", "mxgemm", "build", "--warm"]
        print("mxgemm: JIT warm-up:", " ".join(cmd[1:]), flush=True)
        if subprocess.call(cmd, env=env, cwd=ROOT) != 0:
            print("mxgemm: WARNING: warm-up build failed; kernels will be built on first use",
                  flush=True)


def version():
    for line in (ROOT / "python" / "mxgemm" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')


setup(
    name="mxgemm",
    version=version(),
    description="MXFP8 / MXFP4 / FP8 GEMM kernels for AMD Instinct gfx950 / gfx1250 (HIP + FlyDSL)",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"mxgemm": ["configs/*.csv", "emu/data/*.txt"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",            # any flavour the user already has (ROCm or CPU)
        "ziglang==0.17.0",       # clang 22 + lld with the AMDGPU backend (gfx950, gfx1250)
        "flydsl==0.4.2",         # FlyDSL kernels; API drifts between releases, so pinned
        "numpy>=1.26", "pybind11>=2.12", "ninja>=1.11", "ml_dtypes>=0.5", "pyyaml>=6.0",
    ],
    cmdclass={"build_py": build_py_and_warm},
)
