"""DeepGEMM's runtime settings (2.6) with their AMD meaning.

``set_num_sms(n)`` caps the grid of the persistent kernels (mxgemm.deep_gemm's dense and
K-grouped GEMMs) at n CUs, leaving the other CUs to concurrent work (communication kernels):
DeepGEMM's SM count is an MI355X's CU count here. The M-grouped kernels launch one workgroup per
output tile and do not read it. The other settings tune NVIDIA-specific mechanisms with no AMD
counterpart in these kernels (tensor-core utilisation targets, programmatic dependent launch,
JIT compile-time dims, block-size rounding): they are kept and returned as set, and change
nothing.
"""
from __future__ import annotations

from .. import guards
from ..hardware import LIMITS

DEVICE_CUS = LIMITS["gfx950"]["cus"]
_state = {"num_sms": DEVICE_CUS, "tc_util": 100, "pdl": False, "ignore_compile_dims": False,
          "block_size_multiple_of": 1}


def _int_in(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        guards.fail(name, f"{name} = {value!r}: an int in {lo}..{hi}")
    return value


def set_num_sms(new_num_sms: int) -> None:
    """Cap the persistent kernels' grid at new_num_sms CUs (1 .. the device's CU count)."""
    _state["num_sms"] = _int_in("num_sms", new_num_sms, 1, DEVICE_CUS)


def get_num_sms() -> int:
    """The CU cap of the persistent kernels (the device's CU count unless set)."""
    return _state["num_sms"]


def set_tc_util(new_tc_util: int) -> None:
    """Kept for DeepGEMM's API (an SM90 scheduling target in percent); changes nothing here."""
    _state["tc_util"] = _int_in("tc_util", new_tc_util, 1, 100)


def get_tc_util() -> int:
    return _state["tc_util"]


def set_pdl(new_enable_pdl: bool) -> None:
    """Kept for DeepGEMM's API (CUDA programmatic dependent launch); changes nothing here."""
    _state["pdl"] = bool(new_enable_pdl)


def get_pdl() -> bool:
    return _state["pdl"]


def set_ignore_compile_dims(new_value: bool) -> None:
    """Kept for DeepGEMM's API (JIT specialisation on shapes); kernels here are compiled ahead."""
    _state["ignore_compile_dims"] = bool(new_value)


def set_block_size_multiple_of(new_value: int) -> None:
    """Kept for DeepGEMM's API (block-size rounding of its heuristics); tiles here come from
    the registry and ``config``."""
    _state["block_size_multiple_of"] = _int_in("block_size_multiple_of", new_value, 1, 1 << 16)
