"""Timing model: how long a launch the emulator ran takes on a machine (an MI355X; gfx1250 on a
machine whose unpublished figures are assumptions), from the instructions its waves really
issued and the addresses they really touched.

    emu = Emulator(arch="gfx950", timing="mi355x")      # or arch="gfx1250", timing="gfx1250-assumed"
    emu.launch(...)                   # as always; waves run one by one, recording a trace
    emu.last_timing                   # {"us", "cycles", "clock_ghz", "limiter", "sampled", "machine_assumed",
                                      #  "breakdown"}

``machine_assumed``: True when the machine's core figures (CU count, clock, caches, bandwidths)
are assumptions, not published values (``gfx1250-assumed``, docs/timing_model.md §7): the time
is a prediction on an assumed machine.

``sampled``: the launch ran only some workgroups (``workgroups=``; ``xcd0_sample`` picks XCD 0's
first rounds, ``rounds_sample`` its first round and one from each stratum of the rest): the time
of one XCD's share is the simulated rounds' time, each standing for the rounds up to the next
one simulated (rounds: waves of resident workgroups). Model, parameters and sources: docs/timing_model.md.
"""
from __future__ import annotations

from .engine import occupancy, replay
from .machine import MACHINES, Machine

__all__ = ["MACHINES", "Machine", "round_workgroups", "rounds_sample", "simulate", "xcd0_rounds", "xcd0_sample"]


def _machine(machine) -> Machine:
    return MACHINES[machine] if isinstance(machine, str) else machine


def _xcd0_share(grid, m) -> int:
    """Workgroups XCD 0 receives: ids 0, xcds, 2 xcds, ... of the linear grid."""
    return -(-grid[0] * grid[1] * grid[2] // m.xcds)


def simulate(machine, prog, kernel, traces, grid, block, lds_bytes, sampled=False) -> dict:
    m = _machine(machine)
    r = replay(m, prog, kernel, traces, grid, lds_bytes, m.clock_ghz)
    span = r["cycles"] * m.simds * r["cus"]
    if span and r["busy"].get("mfma", 0) / span > 0.5:       # sustained matrix load: the lower clock
        clock = m.loaded_clock_ghz
        r = replay(m, prog, kernel, traces, grid, lds_bytes, clock)
    else:
        clock = m.clock_ghz
    share = _xcd0_share(grid, m)
    cycles = _extrapolate(r, share) if sampled else r["cycles"]
    span = max(r["cycles"], 1.0)
    util = {"mfma": r["busy"].get("mfma", 0) / (span * m.simds * r["cus"]),
            "valu": r["busy"].get("valu", 0) / (span * m.simds * r["cus"]),
            "lds": r["busy"].get("lds", 0) / (span * r["cus"]),
            "ta": r["busy"].get("ta", 0) / (span * r["cus"]),
            "l1": r["busy"].get("l1", 0) / (span * r["cus"]),
            "l2": r["busy"].get("l2", 0) / span,
            "mall": r["bytes"].get("mall", 0) / (span * r["mall_bytes_per_clk"]),
            "hbm": r["bytes"].get("hbm", 0) / (span * r["hbm_bytes_per_clk"])}
    top = max(util, key=util.get)
    return dict(us=cycles / (clock * 1e3), cycles=cycles, clock_ghz=clock,
                limiter=top if util[top] > 0.6 else "latency", sampled=bool(sampled), machine_assumed=m.assumed,
                breakdown=dict(busy=util, bytes=r["bytes"], stalls=_by_cause(r["stalls"].values()),
                               occupancy_workgroups_per_cu=r["slots"], workgroups_simulated=r["workgroups"],
                               workgroups_per_xcd=share, blocks=blocks(prog, kernel, r)))


def blocks(prog, kernel, r) -> list:
    """Where the simulated waves spent their time, per basic block (runs of instructions from
    one label to the next), hottest first: instructions issued, and the cycles waves stood at
    the block's instructions by cause (issue: another wave had the SIMD; valu / mfma: the
    pipe was busy; wait: s_waitcnt; barrier: s_barrier)."""
    code = prog.codes[kernel]
    starts = sorted({0, *code.labels.values()})
    names = {}
    for label, i in code.labels.items():
        names.setdefault(i, label)
    out = []
    for a, b in zip(starts, starts[1:] + [len(code.instrs)]):
        if a >= b:
            continue
        stall = _by_cause(r["stalls"].get(pc, {}) for pc in range(a, b))
        n = sum(r["issued"].get(pc, 0) for pc in range(a, b))
        if n or stall:
            out.append(dict(block=names.get(a, "entry"), first=a, last=b - 1, issued=n, stalls=stall,
                            cycles=n + sum(stall.values())))
    return sorted(out, key=lambda x: -x["cycles"])


def _by_cause(stalls) -> dict:
    """Stall cycles per cause, summed over per-instruction dicts (cause -> cycles)."""
    out = {}
    for per_pc in stalls:
        for cause, c in per_pc.items():
            out[cause] = out.get(cause, 0.0) + c
    return out


def _extrapolate(r, share) -> float:
    """Cycles of XCD 0's whole share from the rounds it simulated (a round: as many workgroups
    as it holds at once; the simulated rounds replay back to back). A simulated round stands
    for itself and the rounds up to the next simulated one (the last: up to the end of the
    share), and each one it stands for takes as long as it did (docs/timing_model.md §3)."""
    per_round = r["slots"] * r["cus"]
    total = -(-share // per_round)
    rounds = sorted({k // per_round for k in r["positions"]})
    done = r["done"]
    if len(rounds) >= total:
        return r["cycles"]
    cycles, prev = r["cycles"], 0.0
    for p, j in enumerate(rounds):
        end = done[min((p + 1) * per_round, len(done)) - 1]
        stands_for = (rounds[p + 1] if p + 1 < len(rounds) else total) - j
        cycles += (stands_for - 1) * (end - prev)
        prev = end
    return cycles


def xcd0_sample(grid, count: int, machine="mi355x") -> list:
    """Workgroup ids of the first ``count`` workgroups XCD 0 receives (dispatch order): what a
    sampled timing run executes."""
    m = _machine(machine)
    gx, gy, gz = grid
    ids = range(0, gx * gy * gz, m.xcds)[:count]
    return [(i % gx, i // gx % gy, i // (gx * gy)) for i in ids]


def round_workgroups(machine, prog, kernel, block, dynamic_lds) -> int:
    """Workgroups XCD 0 holds at once (a round): its CUs times the kernel's occupancy."""
    m = _machine(machine)
    meta = prog.kernel_meta(kernel)
    waves = -(-block[0] * block[1] * block[2] // m.wave_size)
    return occupancy(m, meta, waves, meta.group_segment_fixed_size + dynamic_lds) * (m.cus // m.xcds)


def rounds_sample(machine, prog, kernel, grid, block, dynamic_lds, rounds: int):
    """The workgroups of ``rounds`` rounds of XCD 0's share (None when that is its whole share):
    what a sampled timing run of this launch executes. The first round (caches and pipes
    filling) and one round from each of ``rounds - 1`` equal strata of the rest, the stratum's
    first: a grid whose later workgroups do less (padded tails, early exits) is represented
    by rounds from all along it, not by its first ones (docs/timing_model.md §3)."""
    m = _machine(machine)
    per_round = round_workgroups(m, prog, kernel, block, dynamic_lds)
    share = _xcd0_share(grid, m)
    total = -(-share // per_round)
    if rounds >= total:
        return None
    picked = [0] + [1 + i * (total - 1) // (rounds - 1) for i in range(rounds - 1)]
    ks = [k for j in picked for k in range(j * per_round, min((j + 1) * per_round, share))]
    gx, gy, _ = grid
    return [(i % gx, i // gx % gy, i // (gx * gy)) for i in (k * m.xcds for k in ks)]


def xcd0_rounds(machine, prog, kernel, grid, block, dynamic_lds, rounds: int) -> list:
    """rounds_sample's workgroups, or XCD 0's whole share when the rounds cover it. The engine
    replays XCD 0 alone, so the other XCDs' workgroups change no timing: the same time for an
    eighth of the emulation, the outputs written by XCD 0's workgroups only."""
    return rounds_sample(machine, prog, kernel, grid, block, dynamic_lds, rounds) or \
        xcd0_sample(grid, _xcd0_share(grid, _machine(machine)), machine)
