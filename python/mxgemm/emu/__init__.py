"""CPU emulator for AMDGPU kernel assembly (targets gfx950: CDNA4, wave64; gfx1250: wave32).

    from mxgemm.emu import Emulator, EmulatorFault, RaceError, UnsupportedInstruction
    emu = Emulator(arch="gfx950", race_check=True, wg_order="linear")   # or "shuffled", seed=, lockstep=False
    prog = emu.load(asm_text)            # clang -S / FlyDSL ISA dump text
    emu.launch(prog, "kernel", grid=(gx, gy, gz), block=(bx, by, bz), args=[...])
    emu.launch_kernarg(prog, "kernel", grid, block, kernarg_bytes, buffers=[...])
    emu.launch(..., workgroups=[(x, y, z), ...])   # run only these workgroups of the grid
    emu.last_stats                       # counters of the last launch (dict, see ``stats``)
    big = emu.sparse_buffer(nbytes)      # lazily paged; big.write(off, t), big.read(off, n)

Timing (``mxgemm.timing``, docs/timing_model.md): ``Emulator(arch="gfx950", timing="mi355x")``
(gfx1250: ``timing="gfx1250-assumed"``) runs every launch as above and also predicts its time
on that machine::

    emu.last_timing   # {"us", "cycles", "clock_ghz", "limiter": mfma|valu|lds|l1|l2|hbm|latency,
                      #  "sampled": bool (only some workgroups ran: workgroups=, rounds_sample),
                      #  "machine_assumed": bool (the machine's CU count, clock, caches and
                      #      bandwidths are assumptions, not published: gfx1250-assumed),
                      #  "breakdown": {"busy": per unit fraction, "bytes": per level,
                      #                "stalls": cycles by cause, "occupancy_workgroups_per_cu",
                      #                "workgroups_simulated", "workgroups_per_xcd",
                      #                "blocks": per basic block issued + stall cycles by cause}}

Ops are timed through ``mxgemm.launcher.emulator_settings(timing="mi355x")`` and
``launcher.timings()``; ``python -m mxgemm time KERNEL`` prints one.

Modules: ``isa`` (operand decoding, errors, handler tables), ``asm`` (assembly and metadata
parsing), ``target`` (what the core needs to know about an ISA target) and one module per
target (``gfx950``: wave size, named SGPRs, s_waitcnt encoding, LDS size, handler table;
``gfx1250``: the same plus split wait counters and barriers, gfx12 names mapped onto the gfx9
builders, with ``wmma`` (matrix) and ``tdm`` (tensor data mover) handler modules),
``regs`` (register/operand access), ``memory`` (global buffers), ``memfault`` (fault text
naming the nearest buffer), ``lds`` (shared memory), ``race`` (outstanding-load and LDS race
tracking), ``wave`` (waves, workgroups, scheduling, private segments), ``launch`` (programs,
kernarg/ABI, the Emulator), ``stats`` (per-launch counters, workgroup windows); handler
modules ``salu`` / ``valu`` / ``vmem`` (also private/scratch memory) / ``matrix`` / ``mxcvt``
/ ``lds_transpose`` / ``float_atomics``. A new target is a new module building a ``Target``
from its tables, listed in ``launch.TARGETS``.

Handler-registration API (for handler modules such as ``emu/matrix.py``)
-----------------------------------------------------------------------
A handler module registers *builders* in a handler table (``isa.GFX9``, via ``isa.handler``, or
``isa.GFX12`` for gfx12-only instructions);
a builder runs once per instruction at ``emu.load`` time and returns the closure executed
each time a wave issues the instruction::

    from mxgemm.emu import regs as R
    from mxgemm.emu.isa import handler, Instr

    @handler("v_mfma_f32_16x16x128_f8f6f4")        # bare names: _e32/_e64/_sdwa/_dpp stripped
    def _build(ins: Instr):
        dst, a, b, c = ins.ops                      # Operand: kind 'v'|'a'|'s'|'const'|..., index, count
        read_a = R.src_vec(ins, 1)                  # w -> uint32 [w.n, count] (a lane-major copy)
        read_c = R.src_vec(ins, 3)
        write_d = R.dst_vec(ins, 0)                 # (w, uint32 [w.n, count]) -> None, EXEC-masked
        cbsz = ins.mods.get("cbsz", 0)              # modifiers: flags -> True, key:val -> int/list
        def run(w):                                 # w: wave.Wave
            write_d(w, my_math(read_a(w), read_c(w), cbsz))
        return run

The module must be imported by the target module (``gfx950.py``) so that its handlers exist.
``ins.prog`` gives the program's ``race`` flag, ``target`` and the kernel's ``meta``.

Operand access helpers in ``regs`` (all build closures once; all do race checks):
  src(ins, i, ty)      w -> one value per lane: uint32/int32/float32 [w.n] array or numpy
                       scalar (SGPR/constant); ty in b32,u32,i32,f32,f16,bf16,b16,u16,i16,
                       b64,u64,i64,f64. f32/f16/f64 apply the operand's neg/abs.
                       ``src(ins, i, "f16", hi=True)`` reads the high half.
  dst(ins, i, ty)      (w, value) -> None; bit-casts value of type ty into the register(s),
                       only lanes in EXEC.  ``dst(ins, i, "b16", hi=True)`` writes a half.
                       An SGPR that is PerWave (below) reads as one value per lane.
  sdst(ins, i, bits)   (w, Python int or PerWave) -> None for scalar destinations (EXEC writes
                       update the mask).
  src_vec / dst_vec    whole register tuples as uint32 [w.n, n] (VGPR/AGPR/SGPR/constant);
  src_rows             the same as rows, uint32 [n, w.n] (a view of the register file).
  read_checked(ins, i, get)  wraps a custom getter of operand i with the race check.
  mask_of(x, n) / bits_of(b) convert lane masks between ints and bool arrays.
Wave state (``wave.Wave``; a lockstep unit of k waves, possibly of several workgroups of a
batch, is one Wave with n = k * T.wave lanes, wave-major): T (the target), k, n (lanes), lane
(lane index within its wave [n]), V (uint32 [nvgpr, n] unified VGPR+AGPR file, register-major;
AGPR a[i] is row prog.meta.accum_offset + i), S (list in the target's numbering: T.vcc, T.m0,
T.exec; each a Python int, or an ``isa.PerWave`` when the unit's waves differ -- any arithmetic
on it raises ``Split``, so a handler that does not expect one runs wave by wave), scc (int or
PerWave), exec (int), mask (bool [n], EXEC), full (EXEC all ones), wg (the batch: .lds uint8
array, one .lds_size region per workgroup), lds_base (the unit's region offset: an int, or per
lane), private(nbytes) (the lanes' private segments, uint8 [n, nbytes]), emu, prog, kernel.
Register ``scalar=True`` for a builder whose closure reads and writes only SGPRs and SCC: a
unit holding PerWave values then runs it once per wave; ``per_wave=True`` for one that must
never run in lockstep.
Memory: ``w.emu.mem.load(addr u64[n], mask, nbytes) -> uint8 [n, nbytes]``, ``.store(addr, mask,
data)``, ``.atomic(addr, mask, dtype, fn)`` (lane-ordered read-modify-write, fn(old, lane_index)
-> new, returns old values); LDS via ``lds.load(w, addr int[n], nbytes)`` / ``lds.store(w, addr,
data)`` (bounds and cross-wave race checks included). Loads that complete asynchronously call
``race.track_load(w, ins, counter, keys)`` so race mode can flag early reads;
``regs.reg_keys(ins, i)`` gives the keys of operand i. Raise ``EmulatorFault`` /
``UnsupportedInstruction`` from ``isa``; the runner adds the kernel, line and text.
"""
from .isa import EmulatorError, EmulatorFault, RaceError, UnsupportedInstruction
from .launch import Emulator
from .memory import SparseBuffer

__all__ = ["Emulator", "EmulatorFault", "RaceError", "UnsupportedInstruction", "SparseBuffer",
           "EmulatorError"]
