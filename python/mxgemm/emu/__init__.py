"""CPU emulator for gfx950 (CDNA4, wave64) kernel assembly.

    from mxgemm.emu import Emulator, EmulatorFault, RaceError, UnsupportedInstruction
    emu = Emulator(arch="gfx950", race_check=True, wg_order="linear")   # or "shuffled", seed=
    prog = emu.load(asm_text)            # clang -S / FlyDSL ISA dump text
    emu.launch(prog, "kernel", grid=(gx, gy, gz), block=(bx, by, bz), args=[...])
    emu.launch_kernarg(prog, "kernel", grid, block, kernarg_bytes, buffers=[...])
    emu.launch(..., workgroups=[(x, y, z), ...])   # run only these workgroups of the grid
    emu.last_stats                       # counters of the last launch (dict, see ``stats``)
    big = emu.sparse_buffer(nbytes)      # lazily paged; big.write(off, t), big.read(off, n)

Modules: ``isa`` (operand decoding, errors, handler registry), ``asm`` (assembly and
metadata parsing), ``machine`` (waves, memory, scheduling, race tracking, launch),
``salu`` / ``valu`` / ``vmem`` (instruction handlers; ``vmem`` also private/scratch memory),
plug-ins such as ``matrix``, ``stats`` (counters, workgroup windows), ``memfault`` (fault text).

Handler-registration API (for plug-in modules such as ``emu/matrix.py``)
------------------------------------------------------------------------
A plug-in registers *builders*; a builder runs once per instruction at ``emu.load`` time
and returns the closure executed each time a wave issues the instruction::

    from mxgemm.emu.isa import handler, Instr
    from mxgemm.emu import machine as M

    @handler("v_mfma_f32_16x16x128_f8f6f4")        # bare names: _e32/_e64/_sdwa/_dpp stripped
    def _build(ins: Instr):
        dst, a, b, c = ins.ops                      # Operand: kind 'v'|'a'|'s'|'const'|..., index, count
        read_a = M.src_vec(ins, 1)                  # w -> uint32 [64, count] (lane-major copy)
        read_c = M.src_vec(ins, 3)
        write_d = M.dst_vec(ins, 0)                 # (w, uint32 [64, count]) -> None, EXEC-masked
        cbsz = ins.mods.get("cbsz", 0)              # modifiers: flags -> True, key:val -> int/list
        def run(w):                                 # w: machine.Wave
            write_d(w, my_math(read_a(w), read_c(w), cbsz))
        return run

Operand access helpers in ``machine`` (all build closures once; all do race checks):
  src(ins, i, ty)      w -> one value per lane: uint32/int32/float32 [64] array or numpy
                       scalar (SGPR/constant); ty in b32,u32,i32,f32,f16,bf16,b16,u16,i16,
                       b64,u64,i64,f64. f32/f16/f64 apply the operand's neg/abs.
                       ``src(ins, i, "f16", hi=True)`` reads the high half.
  dst(ins, i, ty)      (w, value) -> None; bit-casts value of type ty into the register(s),
                       only lanes in EXEC.  ``dst(ins, i, "b16", hi=True)`` writes a half.
  src_vec / dst_vec    whole register tuples as uint32 [64, n] (VGPR/AGPR/SGPR/constant).
Wave state (``machine.Wave``): V (uint32 [64, 512] unified VGPR+AGPR file, lane-major;
AGPR a[i] is column prog.accum_offset + i), S (list of Python ints, gfx9 numbering: vcc =
106/107, m0 = 124, exec = 126/127), scc, exec (int), mask (bool [64], EXEC), full
(EXEC all ones), wg (workgroup: .lds uint8 array), emu, prog, kernel.
Memory for plug-ins: ``w.emu.mem.load(addr u64[64], mask, nbytes) -> uint8 [64, nbytes]``,
``.store(addr, mask, data)``, ``.atomic(addr, mask, dtype, fn)`` (lane-ordered read-modify-
write, fn(old, lane_index) -> new, returns old values); LDS via ``M.lds_load(w, addr u32[64],
nbytes)`` / ``M.lds_store(w, addr, data)`` (bounds and cross-wave race checks included).
Loads that complete asynchronously call ``M.track_load(w, ins, counter, keys)`` so race
mode can flag early reads; ``M.reg_keys(ins, i)`` gives the keys of operand i.
Raise ``EmulatorFault`` / ``UnsupportedInstruction`` from ``isa``; the runner adds the
kernel, line and text. Import plug-ins in ``machine._PLUGINS`` (listed by module name).
"""
from .isa import EmulatorError, EmulatorFault, RaceError, UnsupportedInstruction  # noqa: F401
from .machine import Emulator, SparseBuffer  # noqa: F401

__all__ = ["Emulator", "EmulatorFault", "RaceError", "UnsupportedInstruction", "SparseBuffer",
           "EmulatorError"]
