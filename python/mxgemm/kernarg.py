"""The kernarg segment, packed from a kernel's metadata: the one packer of the HIP launcher and
the emulator, so both see the same bytes.

``slots`` are the metadata's (offset, size, value_kind) triples in kernel-argument order,
hidden arguments included (code object v5; LLVM AMDGPUUsage, "Code Object V5 Metadata").
"""
from __future__ import annotations

import struct

_FLOAT_FORMATS = {2: "<e", 4: "<f", 8: "<d"}


def layout(info) -> tuple:
    """(slots, kernarg size) of a kernel (an mxgemm.asm_facts.KernelInfo)."""
    return [(a[".offset"], a[".size"], a[".value_kind"]) for a in info.args], info.kernarg_size


def grid_dims(grid, block) -> int:
    """hidden_grid_dims is the AQL dispatch packet's dimensionality. The packet's grid is
    counted in work-items, so a dimension counts once it holds more than one work-item."""
    items = [g * b for g, b in zip(grid, block)]
    return 3 if items[2] > 1 else 2 if items[1] > 1 else 1


def _hidden(kind: str, grid, block, dynamic_lds: int, runtime: dict) -> int:
    """The hidden arguments a launch defines; ``runtime`` holds what the runtime supplies
    (the emulator's LDS aperture); every other one (printf, heap, queue, ...) is unused by
    mxgemm kernels and stays 0."""
    if kind in runtime:
        return runtime[kind]
    axis = "xyz".find(kind[-1])
    if kind.startswith("hidden_block_count_"):
        return grid[axis]
    if kind.startswith("hidden_group_size_"):
        return block[axis]
    if kind == "hidden_grid_dims":
        return grid_dims(grid, block)
    if kind == "hidden_dynamic_lds_size":
        return dynamic_lds
    return 0  # hidden_remainder_*: grids are whole workgroups by construction


def pack(slots, size: int, args, grid, block, dynamic_lds: int = 0, pointer=None, runtime=None) -> bytes:
    """``args`` in kernel-argument order at their metadata offsets, then the hidden arguments.
    Pointer slots take what ``pointer(value)`` returns as an address (default: a tensor's
    data_ptr, None as a null pointer); by-value slots take ints and floats."""
    pointer = pointer or tensor_address
    buf = bytearray(size)
    explicit = [s for s in slots if not s[2].startswith("hidden_")]
    if len(args) != len(explicit):
        raise TypeError(f"kernel takes {len(explicit)} arguments, {len(args)} given")
    for i, ((off, n, kind), a) in enumerate(zip(explicit, args)):
        if kind == "global_buffer":
            buf[off:off + n] = pointer(a, i).to_bytes(n, "little")
        elif kind == "by_value" and isinstance(a, float):
            if n not in _FLOAT_FORMATS:
                raise TypeError(f"argument {i}: cannot pack a float into {n} bytes")
            buf[off:off + n] = struct.pack(_FLOAT_FORMATS[n], a)
        elif kind == "by_value" and isinstance(a, int):
            if not -(1 << (8 * n - 1)) <= a < (1 << (8 * n)):
                raise OverflowError(f"argument {i} = {a} does not fit its {n}-byte slot")
            buf[off:off + n] = (a & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
        else:
            raise TypeError(f"argument {i} ({kind} slot) cannot take {type(a).__name__}")
    write_hidden(buf, slots, grid, block, dynamic_lds, runtime or {})
    return bytes(buf)


def write_hidden(buf: bytearray, slots, grid, block, dynamic_lds: int, runtime: dict) -> None:
    """Write the hidden arguments of a launch into kernarg segment ``buf`` (what a HIP runtime
    does to the segment it is given); slots past the segment's end are left out."""
    for off, n, kind in slots:
        if kind.startswith("hidden_") and off + n <= len(buf):
            buf[off:off + n] = _hidden(kind, grid, block, dynamic_lds, runtime).to_bytes(n, "little")


def tensor_address(a, i: int) -> int:
    """A pointer slot's value: a tensor's data_ptr, or 0 for None (an optional tensor the kernel
    is told not to read)."""
    if a is None:
        return 0
    if not hasattr(a, "data_ptr"):
        raise TypeError(f"argument {i} must be a tensor (pointer slot), got {type(a).__name__}")
    return a.data_ptr()
