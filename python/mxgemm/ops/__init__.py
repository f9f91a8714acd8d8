"""Public ops, one kernel family per module. Importing registers each op's planner."""
from .dequant import mxfp8_dequantize  # noqa: F401
