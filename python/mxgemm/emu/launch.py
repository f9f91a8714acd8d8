"""Programs (decoded once per kernel) and the Emulator: kernarg packing, buffers, the launch
ABI (user/system SGPRs, work-item ids in v0) and the loop over workgroups."""
from __future__ import annotations

import struct

import numpy as np

from .. import kernarg
from . import asm as _asm
from . import gfx950, gfx1250, pc
from .isa import SHARED_BASE, EmulatorError, EmulatorFault, Split, UnsupportedInstruction, u32, u64
from .memory import Memory, SparseBuffer
from .stats import LaunchCounter, select_workgroups
from .wave import Wave, Workgroups, run_cluster

TARGETS = {t.arch: t for t in (gfx950.TARGET, gfx1250.TARGET)}
BATCH_WAVES = 64    # waves of the workgroups run together as one batch (lockstep units may span them)
GLOBAL_ATOMICS = ("global_atomic", "buffer_atomic", "flat_atomic")


class Program:
    def __init__(self, text, race, target):
        self.text, self.race, self.target = text, race, target
        self.codes, self.metas = _asm.parse(text, target.sgprs)
        self.kernels = [k for k in self.metas if k in self.codes]
        self._decoded = {}
        self.meta = None

    def kernel_meta(self, name):
        if name not in self.metas:
            raise KeyError(f"kernel {name!r} not in program (has {self.kernels})")
        return self.metas[name]

    def decoded(self, name):
        """Closures of the kernel's instructions (built once; raises UnsupportedInstruction)."""
        if name in self._decoded:
            return self._decoded[name]
        code = self.codes[name]
        view = _KernelView(self, name)
        view.code = pc.code_addresses(self.text, code, self.target.arch)
        fns = []
        for i, ins in enumerate(code.instrs):
            ins.prog, ins.index = view, i
            for op in ins.ops:
                if op.kind == "label":
                    if op.text not in code.labels:
                        raise UnsupportedInstruction(f"unknown label {op.text} at {ins.where()}")
                    ins.target = code.labels[op.text]
            b = self.target.handlers.builder(ins)
            if b is None:
                raise UnsupportedInstruction(f"unsupported instruction {ins.mnemonic!r} in {ins.where()}")
            try:
                f = b(ins)
                fns.append(_per_wave(f) if ins.per_wave else f)
            except EmulatorError:
                raise
            except Exception as e:
                raise UnsupportedInstruction(f"cannot decode {ins.where()}: {e!r}") from e
        self._decoded[name] = (fns, code.instrs)
        return self._decoded[name]


def _per_wave(f):
    def run(w):
        if w.k > 1:
            raise Split()
        f(w)
    return run


class _KernelView:
    """What a builder sees as ins.prog: the program's race flag and target, the kernel's metadata
    and its instructions' code addresses (``code``, a pc.CodeAddresses)."""

    def __init__(self, prog, name):
        self.race, self.target, self.meta, self.program = prog.race, prog.target, prog.metas[name], prog


# ---------------------------------------------------------------------------- emulator

def _address(a, i: int) -> int:
    """A pointer slot's value for the emulator: a CPU tensor, a sparse buffer or a raw address."""
    if isinstance(a, SparseBuffer):
        return a.address
    if isinstance(a, int):
        return a
    if getattr(a, "device", None) is not None and a.device.type != "cpu":
        raise TypeError(f"argument {i}: only CPU tensors can be emulated")
    return kernarg.tensor_address(a, i)


class Emulator:
    # hidden arguments the runtime supplies: the emulator's flat aperture of LDS
    hidden_runtime = {"hidden_shared_base": SHARED_BASE >> 32}

    def __init__(self, arch="gfx950", race_check=True, wg_order="linear", seed=0, lockstep=True,
                 strict_buffer_oob=False, timing=None):
        """lockstep: run identical waves of a workgroup as one unit (wave.py); False runs every
        wave on its own (the reference schedule, for comparison). strict_buffer_oob: raise where
        a raw buffer access is in range or not depending on whether soffset counts in the range
        check (the sources disagree: docs/buffer_oob.md). timing: a machine of mxgemm.timing
        of the emulator's arch ("mi355x" for gfx950, "gfx1250-assumed" for gfx1250, or a
        timing.Machine): every launch also predicts its time there
        (``last_timing``); waves then run one by one, each recording what it issued."""
        if arch not in TARGETS:
            raise ValueError(f"arch {arch!r} is not emulated (targets: {', '.join(TARGETS)})")
        self.target = TARGETS[arch]
        if wg_order not in ("linear", "shuffled"):
            raise ValueError("wg_order must be 'linear' or 'shuffled'")
        self.arch, self.race, self.wg_order, self.seed, self.lockstep = arch, race_check, wg_order, seed, lockstep
        self.strict_buffer_oob = strict_buffer_oob
        self.timing, self.tracer, self.last_timing = timing, None, None
        if timing is not None:
            from ..timing import MACHINES, Machine
            if not isinstance(timing, Machine) and timing not in MACHINES:
                raise ValueError(f"timing {timing!r}: machines are {', '.join(MACHINES)}")
            machine = timing if isinstance(timing, Machine) else MACHINES[timing]
            if machine.arch != arch:
                raise ValueError(f"timing machine {machine.name!r} times {machine.arch} launches, not {arch}")
            self.lockstep = False
        self._next_sparse = 1 << 47     # above user-space host pointers, below 2^48 (V# base, LDS aperture)
        self.wave_instructions = 0
        self.launch_execs = ()      # the running launch's per-instruction issue counts (salu.clock)
        self.widest_unit = 0     # most waves one lockstep unit ran in the last launch
        self.mem = None
        self.last_stats = None      # counters of the last launch (see emu.stats)

    def load(self, asm_text: str) -> Program:
        return Program(asm_text, self.race, self.target)

    @staticmethod
    def unsupported_mnemonics(asm_text: str, arch: str = "gfx950") -> set:
        T = TARGETS[arch]
        codes, _ = _asm.parse(asm_text, T.sgprs)
        return {i.mnemonic for c in codes.values() for i in c.instrs if T.handlers.builder(i) is None}

    def sparse_buffer(self, nbytes: int) -> SparseBuffer:
        b = SparseBuffer(nbytes, self._next_sparse)
        self._next_sparse += (int(nbytes) + (1 << 32) + 0xFFFF) & ~0xFFFF   # 4 GB guard gap
        return b

    # -- kernarg packing
    def pack_kernarg(self, prog, kernel, grid, block, args, dynamic_lds=0) -> bytes:
        """mxgemm.kernarg's packing; pointer slots also take sparse buffers and raw addresses."""
        meta = prog.kernel_meta(kernel)
        slots = [(a.offset, a.size, a.value_kind) for a in meta.args]
        return kernarg.pack(slots, max(meta.kernarg_size, 1), list(args), grid, block, dynamic_lds,
                            pointer=_address, runtime=self.hidden_runtime)

    def launch(self, prog, kernel, grid=(1, 1, 1), block=(64, 1, 1), args=(), dynamic_lds=0, workgroups=None):
        grid, block = _dim3(grid), _dim3(block)
        kernarg = self.pack_kernarg(prog, kernel, grid, block, list(args), dynamic_lds)
        import torch
        bufs = [a for a in args if isinstance(a, (torch.Tensor, SparseBuffer))]
        self.launch_kernarg(prog, kernel, grid, block, kernarg, bufs, dynamic_lds, workgroups)

    def launch_kernarg(self, prog, kernel, grid, block, kernarg: bytes, buffers, dynamic_lds=0, workgroups=None):
        """workgroups: iterable of (x, y, z) ids to run (None = the whole grid)."""
        import torch
        grid, block = _dim3(grid), _dim3(block)
        meta = prog.kernel_meta(kernel)
        _check_block(meta, block)
        fns, instrs = prog.decoded(kernel)
        self.last_stats, counter = None, LaunchCounter(instrs)
        self.launch_execs = counter.execs
        self.widest_unit = 0
        fns = counter.wrap(fns)
        mem = self.mem = Memory()
        if self.timing is not None:
            from ..timing.trace import Tracer
            self.tracer = mem.tracer = Tracer()
            fns = self.tracer.wrap(fns)
        for b in buffers:
            if isinstance(b, SparseBuffer):
                mem.add(b.address, b.nbytes, sparse=b)
            elif isinstance(b, torch.Tensor):
                st = b.untyped_storage()
                mem.add_host(st.data_ptr(), st.nbytes())
            else:
                raise TypeError(f"buffers: expected torch tensors or sparse buffers, got {type(b)}")
        karg = np.frombuffer(bytearray(kernarg) + bytes(64), np.uint8).copy()
        mem.add(karg.ctypes.data, karg.size, karg)
        packet = np.zeros(64, np.uint8)   # hsa_kernel_dispatch_packet (64 bytes): sizes at 4..23
        struct.pack_into("<HHHHIII", packet, 2, 0, block[0], block[1], block[2], 0,
                         grid[0] * block[0], grid[1] * block[1])
        struct.pack_into("<I", packet, 20, grid[2] * block[2])
        mem.add(packet.ctypes.data, packet.size, packet)
        lds_bytes = meta.group_segment_fixed_size + dynamic_lds
        T = prog.target
        if lds_bytes > T.lds_bytes:
            raise EmulatorFault(f"kernel {kernel!r} needs {lds_bytes} bytes of LDS; {T.arch} has {T.lds_bytes}")
        cdims = meta.cluster_dims if meta.cluster_dims and meta.cluster_dims != (1, 1, 1) else None
        if cdims and (any(g % c for g, c in zip(grid, cdims)) or workgroups is not None):
            raise ValueError(f"kernel {kernel!r} runs in clusters of {cdims} workgroups: the grid {grid} must be "
                             f"whole clusters (and runs whole)")
        units = cdims or (1, 1, 1)     # workgroups run together: a cluster, or one workgroup
        order = select_workgroups(grid, workgroups) if workgroups is not None else \
            [(x, y, z) for z in range(0, grid[2], units[2]) for y in range(0, grid[1], units[1])
             for x in range(0, grid[0], units[0])]
        if self.wg_order == "shuffled":
            np.random.default_rng(self.seed).shuffle(order)
        ctx = (meta, fns, counter.execs, instrs, block, grid, karg.ctypes.data, packet.ctypes.data, lds_bytes)
        nwaves = -(-block[0] * block[1] * block[2] // T.wave)
        # Workgroups observe each other's order only through global atomics: a kernel with them
        # runs its workgroups one by one, in launch order (a batch would order them by progress).
        ordered = cdims or not self.lockstep or any(i.base.startswith(GLOBAL_ATOMICS) for i in instrs)
        batch = 1 if ordered else max(1, BATCH_WAVES // nwaves)
        with np.errstate(all="ignore"):  # GPUs raise no FP exceptions: inf/NaN results are data
            for i in range(0, len(order), batch):
                self._run_cluster(prog, kernel, ctx, order[i:i + batch], cdims)
        self._keep = (karg, packet)
        nwg = len(order) * units[0] * units[1] * units[2]
        self.last_stats = counter.stats(nwg, nwg * -(-block[0] * block[1] * block[2] // T.wave))
        self.last_stats["widest_unit"] = self.widest_unit
        if self.timing is not None:
            from ..timing import simulate
            self.last_timing = simulate(self.timing, prog, kernel, self.tracer.waves, grid, block, lds_bytes,
                                        sampled=workgroups is not None)
            self.tracer = None

    def _init_wave(self, w, meta, block, grid, wgid, karg_ptr, pkt_ptr, wid, cluster=None):
        """cluster: (cluster id, this workgroup's position in it) of a cluster launch."""
        d = meta.d
        s = 0
        user = []
        if d("user_sgpr_private_segment_buffer"):
            user += [0, 0, 0, 0]
        if d("user_sgpr_dispatch_ptr"):
            user += [pkt_ptr & 0xFFFFFFFF, pkt_ptr >> 32]
        if d("user_sgpr_queue_ptr"):
            user += [0, 0]
        if d("user_sgpr_kernarg_segment_ptr"):
            user += [karg_ptr & 0xFFFFFFFF, karg_ptr >> 32]
        if d("user_sgpr_dispatch_id"):
            user += [0, 0]
        if d("user_sgpr_flat_scratch_init"):
            user += [0, 0]
        if d("user_sgpr_private_segment_size"):
            user += [0]
        npre = d("user_sgpr_kernarg_preload_length")
        if npre:   # preloaded kernargs follow the other user SGPRs [LLVM AMDGPUUsage, preload]
            kb = self.mem.load(np.array([karg_ptr + 4 * d("user_sgpr_kernarg_preload_offset")], u64),
                               np.ones(1, bool), 4 * npre)[0].view(u32)
            user += [int(x) for x in kb]
        s = d("user_sgpr_count", len(user))
        w.S[:len(user)] = user
        if w.T.ttmp_ids:   # architected SGPRs (docs/gfx1250_emulator.md §1)
            ids, local = cluster or (wgid, (0, 0, 0))     # a cluster launch: the cluster's id, position in ttmp6
            last = tuple(c - 1 for c in (meta.cluster_dims if cluster else (1, 1, 1)))
            w.S[w.T.sgprs["ttmp9"][0]], w.S[w.T.sgprs["ttmp7"][0]] = ids[0], ids[1] | ids[2] << 16
            w.S[w.T.sgprs["ttmp6"][0]] = (local[0] | local[1] << 4 | local[2] << 8 | last[0] << 12 | last[1] << 16
                                          | last[2] << 20 | ((last[0] + 1) * (last[1] + 1) * (last[2] + 1) - 1) << 24)
            w.S[w.T.sgprs["ttmp8"][0]] = wid << 25
        for axis, key in enumerate(("x", "y", "z")):
            if not w.T.ttmp_ids and d(f"system_sgpr_workgroup_id_{key}", 1 if key == "x" else 0):
                w.S[s] = wgid[axis]
                s += 1
        if d("system_sgpr_workgroup_info"):
            s += 1
        if d("enable_private_segment") or d("system_sgpr_private_segment_wavefront_offset"):
            w.S[s] = 0
        nthreads = block[0] * block[1] * block[2]
        n = w.n
        t = np.arange(wid * n, wid * n + n)
        tx, ty, tz = t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1])
        comp = d("system_vgpr_workitem_id")
        # gfx90a+ pack the work-item ids into v0: x | y << 10 | z << 20
        w.V[0] = (tx | ((ty << 10) if comp >= 1 else 0) | ((tz << 20) if comp >= 2 else 0)).astype(u32)
        w.set_exec((1 << min(n, nthreads - wid * n)) - 1)

    def _run_cluster(self, prog, kernel, ctx, firsts, cdims):
        """Run the batch of workgroups ``firsts`` together, or (cdims) the one cluster whose
        first workgroup is firsts[0]."""
        meta, fns, execs, instrs, block, grid, karg_ptr, pkt_ptr, lds_bytes = ctx
        nthreads = block[0] * block[1] * block[2]
        nv = 512 if meta.agpr_count or meta.d("accum_offset", 0) else max(8, ((meta.vgpr_count + 7) // 8) * 8)
        nv = max(nv, meta.d("next_free_vgpr", 0) + 2)
        nwaves = -(-nthreads // prog.target.wave)
        if cdims is None:
            batches = [(firsts, None)]
        else:
            first = firsts[0]
            cid = tuple(f // c for f, c in zip(first, cdims))
            members = [(x, y, z) for z in range(cdims[2]) for y in range(cdims[1]) for x in range(cdims[0])]
            batches = [([tuple(f + l for f, l in zip(first, local))], (cid, local)) for local in members]
        groups, wgs = [], []
        for ids, cluster in batches:
            wg = Workgroups(lds_bytes, prog.race, nwaves, prog.target.wave, nv + (nv & 1), ids)
            waves = []
            for b, wgid in enumerate(ids):
                for wid in range(nwaves):
                    w = Wave(self, prog, kernel, wg, b * nwaves + wid)
                    self._init_wave(w, meta, block, grid, wgid, karg_ptr, pkt_ptr, wid, cluster)
                    if self.tracer is not None:
                        self.tracer.start_wave(w, wgid, wid)
                    waves.append(w)
            groups.append(waves)
            wgs.append(wg)
        if cdims is not None:
            for wg in wgs:
                wg.cluster = wgs
        run_cluster(groups, fns, execs, instrs, self.lockstep)


def _check_block(meta, block):
    """A launch with a workgroup the kernel was not compiled for is an error: above its
    .max_flat_workgroup_size the runtime refuses it, and code compiled for a .reqd_workgroup_size
    may assume it (e.g. wave ids past the tile index LDS past the kernel's allocation)."""
    n = block[0] * block[1] * block[2]
    if meta.reqd_workgroup_size and block != meta.reqd_workgroup_size:
        raise ValueError(f"kernel {meta.name!r} requires workgroup size {meta.reqd_workgroup_size}; "
                         f"launched with block {block}")
    if n > meta.max_flat_workgroup_size:
        raise ValueError(f"kernel {meta.name!r} allows at most {meta.max_flat_workgroup_size} threads per "
                         f"workgroup; launched with block {block} ({n} threads)")


def _dim3(d):
    d = tuple(int(x) for x in (d if isinstance(d, (tuple, list)) else (d,)))
    return (d + (1, 1, 1))[:3]
