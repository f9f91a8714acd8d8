"""The timing engine: the recorded waves of a launch replayed on one XCD of the machine, cycle
by cycle in event order (docs/timing_model.md §1).

Each CU has ``simds`` SIMDs; the CU gives each SIMD an issue opportunity every ``simds`` cycles
(round robin), at which it issues at most one instruction of each type (vector ALU, scalar,
branch, vector memory, LDS, internal), each from a different wave; a wave issues in program
order, at most one instruction per opportunity. Pipes: VALU (``valu_cycles`` a wave64
instruction), the matrix pipe (an MFMA holds it for its cycles: mxgemm.asm_facts.mfma_cycles), the
CU's LDS pipe (bank-conflict cycles, then ``lds_latency``). Global memory goes through a per-CU
address unit (cycles per instruction by its width) and L1, the XCD's L2 (a queue per channel,
lines hashed over them) and the XCD's share of the MALL
(LRU caches of lines, addresses from the run) to HBM, each level with its latency, the fabric
to the MALL and HBM a bandwidth queue each; atomics are applied in the L2 channel at
``atomic_cycles`` a lane; ``s_waitcnt`` waits for the counted operations to
complete in issue order (gfx1250: its split counters, and tensor data mover ops as DMA
through the same memory levels, §7); ``s_barrier`` for the workgroup's waves. Workgroups are dispatched
round-robin over the XCDs and, on one, to CUs as slots free (occupancy from registers, LDS and
waves); the XCDs are taken to be alike, so the one holding workgroup 0 stands for the chip."""
from __future__ import annotations

import heapq
import re
from collections import OrderedDict, defaultdict

from .. import asm_facts
from ..emu.stats import classify
from .machine import wmma_cycles
from .trace import BUFFER_SHIFT

_TRANS = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)_")
_CNT = re.compile(r"(vmcnt|lgkmcnt)\((\d+)\)")
_SPLIT_WAIT = re.compile(r"^s_wait_(\w+?)cnt(_dscnt)?\s+(\S+)")     # gfx12: s_wait_<counter>cnt[_dscnt] imm
_MULTI = re.compile(r"(dwordx[234]|_b(64|96|128))\b")   # more than one dword per lane (a multi-channel access)
_BRANCH = re.compile(r"^s_(branch|cbranch|setpc|swappc|getpc|call)")
_INTERNAL = re.compile(r"^s_(nop|sleep|setprio|sethalt|sched_barrier)")
# The issue type of each kind of instruction: at one issue opportunity a SIMD issues at most one
# of each type (docs/timing_model.md §1); an MFMA is a vector ALU instruction.
_ISSUE_TYPE = {"valu": "v", "mfma": "v", "salu": "s", "smem": "s", "branch": "b", "vmem": "m", "lds": "l",
               "wait": "i", "barrier": "i", "internal": "i", "end": "i"}
# The wait counter each kind of operation counts on (docs/timing_model.md §7): gfx9's two, gfx12's
# split ones (a returning atomic counts as a load).
_COUNTER = {"gfx950": {"load": "vm", "store": "vm", "atomic": "vm", "atomic_ret": "vm", "lds": "lgkm", "smem": "lgkm"},
            "gfx1250": {"load": "load", "store": "store", "atomic": "store", "atomic_ret": "load", "lds": "ds",
                        "smem": "km", "tdm": "tensor"}}
_WAIT_NAME = {"vmcnt": "vm", "lgkmcnt": "lgkm"}


class _Lru:
    def __init__(self, lines):
        self.cap, self.d = lines, OrderedDict()

    def hit(self, line) -> bool:
        if line in self.d:
            self.d.move_to_end(line)
            return True
        self.d[line] = None
        if len(self.d) > self.cap:
            self.d.popitem(last=False)
        return False


def _waits(text):
    """Counter -> N of a wait instruction: gfx9's ``s_waitcnt vmcnt(N) lgkmcnt(M)``, gfx12's
    ``s_wait_loadcnt N`` (the combined ``s_wait_loadcnt_dscnt`` / ``s_wait_storecnt_dscnt``: the
    first counter in bits [13:8], dscnt in [5:0]). Counters nothing here counts on (xcnt,
    samplecnt, bvhcnt) wait for nothing."""
    text = text.split(";")[0].strip()
    split = _SPLIT_WAIT.match(text)
    if split is None:
        return {_WAIT_NAME[c]: int(n) for c, n in _CNT.findall(text)}
    name, ds, imm = split.groups()
    v = int(imm, 0)
    return {name: v >> 8 & 0x3F, "ds": v & 0x3F} if ds else {name: v}


def _static(instrs, m):
    """Per instruction: (kind, cost, waits, counter) from its mnemonic and text (counter: the wait
    counter a memory operation counts on). A vector memory op's cost: (access, more than a dword a
    lane, through the address unit, cycles its LDS write adds: DMA and tensor mover loads)."""
    out = []
    counter = _COUNTER[m.arch]
    for ins in instrs:
        base = ins.base
        cls, _ = classify(base, bool(ins.mods.get("lds")))
        waits = cnt = None
        if cls == "mfma":
            line = ins.text.split(";")[0].strip()
            kind, cost = "mfma", asm_facts.mfma_cycles(line) if m.arch == "gfx950" else wmma_cycles(line)
        elif cls.startswith("tdm"):     # the mover makes its addresses and writes (load) or reads the LDS itself
            load = cls != "tdm_store"
            kind, cnt = "vmem", counter["tdm"]
            cost = ("load" if load else "store", False, False, m.lds_latency if load else 0)
        elif cls.startswith(("vmem", "scratch")):
            kind = "vmem"
            access = "atomic" if "atomic" in base else "store" if "store" in base else "load"
            dma = bool(ins.mods.get("lds")) or base.startswith("global_load_lds")
            cost = (access, bool(_MULTI.search(base)), True, m.lds_latency if dma else 0)
            returns = access == "atomic" and (bool(ins.mods.get("glc")) or "TH_ATOMIC_RETURN" in ins.text)
            cnt = counter["atomic_ret" if returns else access]
        elif cls.startswith("lds"):
            kind, cost, cnt = "lds", 4, counter["lds"]
        elif cls == "waitcnt":
            kind, cost = "wait", 1
            waits = _waits(ins.text)
        elif cls == "barrier":
            kind, cost = "barrier", 1
        elif base.startswith(("s_load", "s_buffer_load")):
            kind, cost, cnt = "smem", 1, counter["smem"]
        elif base == "s_endpgm":
            kind, cost = "end", 1
        elif base == "s_nop":
            kind, cost = "internal", 1 + (ins.ops[0].value if ins.ops else 0)
        elif _INTERNAL.match(base):
            kind, cost = "internal", 1
        elif _BRANCH.match(base):
            kind, cost = "branch", 1
        elif base.startswith("v_"):
            kind, cost = "valu", None
            cost = "trans" if _TRANS.match(base) else "valu"
        else:
            kind, cost = "salu", 1
        out.append((kind, cost, waits, cnt))
    return out


def l2_channel(line, channels=16) -> int:
    """The L2 channel of a line (a 128-byte line index): the XOR of the index's 4-bit groups
    (assumed, docs/timing_model.md §2: AMD's hash is not public). Consecutive lines go to
    consecutive channels; so do strides of 16 lines. The engine hashes a line's index within
    its buffer, as if every buffer began on channel 0 (large GPU allocations are aligned far
    beyond 2 KiB): the host buffers' order in memory, which varies from run to run, must not
    change the time."""
    x = line ^ (line >> 32)
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    return x % channels


def occupancy(m, meta, waves_per_wg, lds_bytes) -> int:
    """Workgroups resident per CU: registers, waves per SIMD and LDS."""
    regs = max(8, -(-(meta.accum_offset + meta.agpr_count if meta.agpr_count else meta.vgpr_count) // 8) * 8)
    per_simd = min(m.waves_per_simd, m.regs_per_simd_lane // regs)
    by_waves = (per_simd * m.simds) // max(1, waves_per_wg)
    by_lds = m.lds_bytes // lds_bytes if lds_bytes else by_waves
    return max(1, min(by_waves, by_lds))


def replay(m, prog, kernel, traces, grid, lds_bytes, clock_ghz) -> dict:
    """Cycles of one XCD's share of the launch, and what kept its units busy."""
    meta = prog.kernel_meta(kernel)
    instrs = prog.decoded(kernel)[1]
    static = _static(instrs, m)
    wgs = defaultdict(list)
    for t in traces:
        wgs[t.wg].append(t)
    order = sorted(wgs, key=lambda g: (g[2], g[1], g[0]))
    gx, gy = grid[0], grid[1]
    xcd0 = [g for g in order if (g[0] + gx * (g[1] + gy * g[2])) % m.xcds == 0] or order[:1]
    waves_per_wg = max(len(wgs[g]) for g in xcd0)
    slots = occupancy(m, meta, waves_per_wg, lds_bytes)
    ncu = m.cus // m.xcds
    hbm_bpc = m.hbm_bytes_per_s / m.xcds / (clock_ghz * 1e9)
    l1 = [_Lru(m.l1_bytes // m.line_bytes) for _ in range(ncu)]
    l2 = _Lru(m.l2_bytes // m.line_bytes)
    taken = [[{} for _ in range(m.simds)] for _ in range(ncu)]    # opportunity cycle -> issue types used

    def opportunity(t, cu, s, typ):
        """The first issue opportunity of SIMD s at or after t with its ``typ`` slot free (SIMD s
        is offered cycles s, s + simds, s + 2 simds, ...)."""
        o = t + (s - t) % m.simds
        slots = taken[cu][s]
        while typ in slots.get(o, ""):
            o += m.simds
        return o

    def take(cu, s, o, typ, now):
        slots = taken[cu][s]
        slots[o] = slots.get(o, "") + typ
        if len(slots) > 64:                  # opportunities before now are never asked for again
            for k in [k for k in slots if k < now]:
                del slots[k]
    valu_free = [[0.0] * m.simds for _ in range(ncu)]
    mfma_free = [[0.0] * m.simds for _ in range(ncu)]
    lds_free = [0.0] * ncu
    ta_free = [0.0] * ncu       # the CU's address unit (texture addresser)
    port_free = [0.0] * ncu     # the CU's L1 port
    busy = defaultdict(float)
    ch_free = [0.0] * m.l2_channels
    ch_busy = [0.0] * m.l2_channels
    ch_xfer = m.line_bytes * m.l2_channels / m.l2_bytes_per_clk
    in_buffer = (1 << BUFFER_SHIFT) - 1      # channels from the line within its buffer (l2_channel)
    mall = _Lru(m.mall_bytes // m.xcds // m.line_bytes)
    mall_bpc = m.mall_bytes_per_s / m.xcds / (clock_ghz * 1e9)
    q = {"mall": 0.0, "hbm": 0.0}
    nbytes = defaultdict(float)
    heap, seq = [], 0
    free = [slots] * ncu
    pending = list(xcd0)
    state = {}
    done_at = []     # workgroup completion times
    stalls = defaultdict(lambda: defaultdict(float))     # pc -> cause -> cycles a wave waited there
    issued = defaultdict(int)                             # pc -> times issued

    def dispatch(now):
        nonlocal seq
        while pending:
            cu = max(range(ncu), key=lambda c: free[c])
            if free[cu] <= 0:
                return
            g = pending.pop(0)
            free[cu] -= 1
            ws = sorted(wgs[g], key=lambda t: t.wave)
            state[g] = dict(cu=cu, left=len(ws), arrived=[], end=now)
            base = (ncu - free[cu]) % m.simds
            for i, t in enumerate(ws):
                wv = dict(t=t, g=g, cu=cu, simd=(base + i) % m.simds, pos=0, cnt=defaultdict(list))
                heapq.heappush(heap, (now, seq, wv))
                seq += 1

    def mem_done(wv, now, rec, kind, multi, ta):
        """When a vector memory instruction's data is back (load) or taken (store, atomic): the
        CU's address unit takes the instruction's lanes (a wave in ``ta_cycles`` or, more than
        a dword a lane, ``ta_multi_cycles``), then its lines leave the CU's L1 port one after
        another; loads that miss the L1, stores and atomics go on, line by line, to the L2 (§1).
        ta=False: a tensor data mover op, whose addresses the mover makes itself (§7)."""
        cu = wv["cu"]
        a = max(now, ta_free[cu])
        ta_free[cu] = a + ((m.ta_multi_cycles if multi else m.ta_cycles) if ta else 0)
        busy["ta"] += ta_free[cu] - a
        start = max(a, port_free[cu])
        lines, lanes = (rec[1].tolist(), rec[2].tolist()) if rec is not None else ((), ())
        per_line = m.line_bytes / m.l1_bytes_per_clk
        port_free[cu] = start + max(1.0, len(lines) * per_line)
        busy["l1"] += port_free[cu] - start
        done = max(ta_free[cu], port_free[cu]) + m.l1_latency
        for i, ln in enumerate(lines):
            if kind == "load" and l1[cu].hit(ln):
                continue
            done = max(done, l2_access(start + (i + 1) * per_line, ln, kind, lanes[i]))
        return done

    def l2_access(t, ln, kind, lanes):
        """A line at its L2 channel (a queue: the line's transfer, plus an atomic's lane
        operations), then on a miss over the fabric to the MALL (a queue at its bandwidth) and on
        a MALL miss to HBM (a queue at its bandwidth). Stores are taken by the L2 (write-back):
        a missing line is allocated and its bytes charged to the fabric and HBM queues on the way
        out, off the store's path. Returns when the data is back or the write is taken."""
        c = l2_channel(ln & in_buffer, m.l2_channels)
        s = max(t, ch_free[c])
        occ = ch_xfer + (lanes * m.atomic_cycles if kind == "atomic" else 0)
        ch_free[c] = s + occ
        ch_busy[c] += occ
        nbytes["l2"] += m.line_bytes
        ready = s + occ
        if l2.hit(ln):
            return ready + m.l2_latency
        f = max(ready, q["mall"])
        q["mall"] = f + m.line_bytes / mall_bpc
        nbytes["mall"] += m.line_bytes
        mall_hit = mall.hit(ln)
        if not mall_hit or kind == "store":       # a written line goes to memory in the end
            h = max(q["mall"], q["hbm"])
            q["hbm"] = h + m.line_bytes / hbm_bpc
            nbytes["hbm"] += m.line_bytes
        if kind == "store":
            return ready + m.l2_latency
        if mall_hit:
            return q["mall"] + m.mall_latency
        return q["hbm"] + m.hbm_latency

    dispatch(0.0)
    end = 0.0
    while heap:
        now, _, wv = heapq.heappop(heap)
        t, cu, s = wv["t"], wv["cu"], wv["simd"]
        if wv["pos"] >= len(t.pcs):
            continue
        pos = wv["pos"]
        pc = t.pcs[pos]
        kind, cost, waits, cnt = static[pc]
        typ = _ISSUE_TYPE[kind]
        issue = opportunity(now, cu, s, typ)
        if issue > now:
            stalls[pc]["issue"] += issue - now
        if kind == "wait":
            ready = issue
            for c, n in waits.items():
                lst = wv["cnt"][c]
                if len(lst) > n:
                    ready = max(ready, lst[len(lst) - n - 1])
                    del lst[:len(lst) - n]
            if ready > issue:
                stalls[pc]["wait"] += ready - issue
                heapq.heappush(heap, (ready, seq, wv))
                seq += 1
                continue
            nxt = issue + 1
        elif kind == "valu":
            if valu_free[cu][s] > issue:
                stalls[pc]["valu"] += valu_free[cu][s] - issue
                issue = opportunity(valu_free[cu][s], cu, s, typ)
            c = m.trans_cycles if cost == "trans" else m.valu_cycles
            valu_free[cu][s] = issue + c
            busy["valu"] += c
            nxt = issue + c
        elif kind == "mfma":
            if mfma_free[cu][s] > issue:
                stalls[pc]["mfma"] += mfma_free[cu][s] - issue
                issue = opportunity(mfma_free[cu][s], cu, s, typ)
            mfma_free[cu][s] = issue + cost
            busy["mfma"] += cost
            nxt = issue + 4
            end = max(end, issue + cost)       # the launch ends when its results are written
        elif kind == "vmem":
            rec = t.mem.get(pos)
            access, multi, ta, lds_write = cost
            done = mem_done(wv, issue, rec if rec and rec[0] == "vmem" else None, access, multi, ta) + lds_write
            lst = wv["cnt"][cnt]
            lst.append(max(done, lst[-1] if lst else 0.0))
            end = max(end, done)
            nxt = issue + 4
        elif kind == "lds":
            rec = t.mem.get(pos)
            cyc = rec[1] if rec and rec[0] == "lds" else 1
            start = max(issue, lds_free[cu])
            lds_free[cu] = start + cyc
            busy["lds"] += cyc
            lst = wv["cnt"][cnt]
            lst.append(max(start + m.lds_latency + cyc, lst[-1] if lst else 0.0))
            nxt = issue + cost
        elif kind == "smem":
            wv["cnt"][cnt].append(issue + m.smem_latency)
            nxt = issue + 1
        elif kind == "barrier":
            st = state[wv["g"]]
            wv["arrive"] = issue
            st["arrived"].append(wv)
            take(cu, s, issue, typ, now)
            wv["pos"] = pos + 1
            if len(st["arrived"]) == st["left"]:
                go = max(a["arrive"] for a in st["arrived"]) + m.barrier_latency
                for a in st["arrived"]:
                    stalls[a["t"].pcs[a["pos"] - 1]]["barrier"] += go - a["arrive"]
                    heapq.heappush(heap, (go, seq, a))
                    seq += 1
                st["arrived"] = []
            continue
        elif kind == "end":
            st = state[wv["g"]]
            st["left"] -= 1
            wv["pos"] = len(t.pcs)
            end = max(end, issue + 1)
            if st["left"] == 0:
                free[cu] += 1
                done_at.append(issue + 1)
                dispatch(issue + 1)
            elif st["arrived"] and len(st["arrived"]) == st["left"]:
                for a in st["arrived"]:
                    heapq.heappush(heap, (issue + 1, seq, a))
                    seq += 1
                st["arrived"] = []
            continue
        else:
            nxt = issue + cost
        take(cu, s, issue, typ, now)
        issued[pc] += 1
        wv["pos"] = pos + 1
        heapq.heappush(heap, (nxt, seq, wv))
        seq += 1
        end = max(end, nxt)
    busy["l2"] = max(ch_busy)                  # the busiest channel
    return dict(cycles=end, busy=dict(busy), bytes=dict(nbytes), workgroups=len(xcd0),
                positions=[(g[0] + gx * (g[1] + gy * g[2])) // m.xcds for g in xcd0], slots=slots, cus=ncu,
                done=sorted(done_at), stalls={pc: dict(c) for pc, c in stalls.items()}, issued=dict(issued),
                waves_per_wg=waves_per_wg, hbm_bytes_per_clk=hbm_bpc, mall_bytes_per_clk=mall_bpc)
