"""gfx1250 Tensor Data Mover: tensor_load_to_lds / tensor_store_from_lds of a 1-D or 2-D tile
described by a D# in SGPR groups (docs/gfx1250_emulator.md §4 gives the fields and their sources).

One op per wave (the D# is scalar). The tile is a stream of tile_dim1 rows of tile_dim0 elements;
element (i1, i0) is at global byte base + (i1 * row_stride + i0) * size, and out of the tensor
(i0 >= tensor_dim0 or i1 >= tensor_dim1; the dims count from the tile start) it reads 0 / is
not stored. A D# whose predicate (group 0 bits 1:0) is 0 moves nothing but still counts on
TENSORcnt (kernels predicate off the loads past the last K step and keep their wait counts).
In LDS the stream is dense from the D#'s LDS address, plus pad_amount dwords after
every pad_interval dwords when padding is on. Completion: TENSORcnt (s_wait_tensorcnt); until
then the LDS bytes of a load count as in flight (race mode). Gather/scatter, iteration,
3-D+ tiles and multicast to other workgroups of a cluster are not modelled: they raise."""
from __future__ import annotations

import numpy as np

from . import race
from . import regs as R
from .isa import GFX12, EmulatorFault, UnsupportedInstruction, u64


def decode(g0, g1):
    """Fields of a D# from its first two groups (lists of 4 and 8 dword ints)."""
    w0 = g1[0]
    return dict(valid=g0[0] & 3, lds=g0[1], base=g0[2] | (g0[3] & 0x1FFFFFF) << 32, gather=g0[0] >> 31 & 1,
                mcast=w0 & 0xFFFF, size=1 << (w0 >> 16 & 3), iterate=w0 >> 19 & 1, pad=w0 >> 20 & 1,
                pad_every=8 << (w0 >> 22 & 7), pad_bytes=4 * ((w0 >> 25 & 0x7F) + 1),   # 2^(f+1), f+1 dwords
                dim0=g1[1] >> 16 | (g1[2] & 0xFFFF) << 16, dim1=g1[2] >> 16 | (g1[3] & 0xFFFF) << 16,
                tile0=g1[3] >> 16, tile1=g1[4] & 0xFFFF, tile2=g1[4] >> 16, stride=g1[5] | (g1[6] & 0xFFFF) << 32)


def tile_addresses(f):
    """(global byte addresses uint64 [n], in-tensor mask [n], LDS byte addresses int64 [n]) of
    the tile's elements in stream order."""
    rows = max(f["tile1"], 1)
    i1, i0 = np.divmod(np.arange(rows * f["tile0"], dtype=np.int64), f["tile0"])
    size = f["size"]
    g = u64(f["base"]) + ((i1 * f["stride"] + i0) * size).astype(u64)
    ok = (i0 < f["dim0"]) & ((i1 < f["dim1"]) | (f["tile1"] == 0))
    off = (i1 * f["tile0"] + i0) * size
    if f["pad"]:
        off = off + off // f["pad_every"] * f["pad_bytes"]
    return g, ok, f["lds"] + off


def _lds_span(w, la, size):
    """Batch LDS byte addresses of the tile (w is a single wave: tensor ops are per wave)."""
    if la.size and (la.min() < 0 or la.max() + size > w.wg.lds_size):
        raise EmulatorFault(f"tensor tile outside the {w.wg.lds_size}-byte LDS allocation: bytes "
                            f"{int(la.min()):#x}..{int(la.max()) + size:#x}")
    return (la[:, None] + np.arange(w.lds_base, w.lds_base + size)).ravel()


def _multicast_peers(w, mask, store):
    """Workgroups of the cluster (flat ids = mask bits) whose LDS a load writes; None: this one."""
    if not mask:
        return None
    cluster = w.wg.cluster
    if cluster is None or store or mask >> len(cluster):
        raise UnsupportedInstruction(f"tensor multicast mask {mask:#x} outside a cluster launch of that size "
                                     f"(or on a store)")
    return [cluster[i] for i in range(len(cluster)) if mask >> i & 1]


def _build(ins):
    if len(ins.ops) > 2:
        raise UnsupportedInstruction(f"3-D+ or gather tensor descriptors (groups 2, 3): {ins.where()}")
    groups = [R.read_checked(ins, i, lambda w, r=ins.ops[i].index, n=ins.ops[i].count: w.S[r:r + n])
              for i in range(2)]
    store = ins.base == "tensor_store_from_lds"

    def run(w):
        f = decode(*(g(w) for g in groups))
        if not f["valid"]:     # predicated off: moves nothing but still counts on TENSORcnt
            race.track_load(w, ins, "tensor", (), "store")
            return
        if f["gather"] or f["iterate"] or f["tile2"] > 1:
            raise UnsupportedInstruction(f"tensor descriptor with gather/iterate/3-D tile: {f}")
        peers = _multicast_peers(w, f["mcast"], store)
        g, ok, la = tile_addresses(f)
        size = f["size"]
        by = _lds_span(w, la, size)
        d = np.unique(by >> 2) if w.race else None
        if store:
            if w.race:
                race.lds_check(w, d, False)
            w.emu.mem.store(g, ok, w.wg.lds[by].reshape(-1, size))
            race.track_load(w, ins, "tensor", (), "store")
            return
        data = np.where(ok[:, None], w.emu.mem.load(g, ok, size), 0)     # out of the tensor: 0
        if peers is None or w.wg in peers:
            if w.race:
                race.lds_check(w, d, True, inflight=True)
            w.wg.lds[by] = data.ravel()
        for p in peers or ():
            if p is not w.wg:      # the same bytes into a peer's LDS (not race-tracked there)
                p.lds[by] = data.ravel()
        race.track_load(w, ins, "tensor", (), "async", lds=d)
    return run


GFX12.register("tensor_load_to_lds", "tensor_store_from_lds", per_wave=True)(_build)
