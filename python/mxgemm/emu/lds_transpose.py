"""ds_read_b64_tr_b4/_b8/_b16 and ds_read_b96_tr_b6: transposing LDS reads (ISA §11.4).

The ISA gives no lane formula; we use Triton's model (docs/gfx950_isa.md §3), which rocjitsu's
"16-lane destination-centric" model matches: each 16-lane group is independent; lane i of the
group loads its own 64 (96) bits as N = 64/bits (96/6 = 16) elements L[i][0..N-1], and lane j
receives R[j][e] = L[(16/N) e + j/N][j mod N]. For b6 we extrapolate the same formula (N = 16,
a plain 16x16 transpose like b4); it is not spelled out by any source.
"""
from __future__ import annotations

import functools

import numpy as np

from . import lds, race
from . import regs as R
from .isa import handler

# element bits -> bytes read per lane
TR_BYTES = {4: 8, 8: 8, 16: 8, 6: 12}


@functools.lru_cache(maxsize=None)
def _tr_index(bits: int):
    """(src_lane [64, N], src_item [64, N]) of R[lane][e]."""
    n = TR_BYTES[bits] * 8 // bits
    j = np.arange(64)[:, None]
    e = np.arange(n)[None, :]
    g, jj = j // 16, j % 16
    src_lane = 16 * g + (16 // n) * e + jj // n
    src_item = np.broadcast_to(jj % n, src_lane.shape)
    return src_lane, np.ascontiguousarray(src_item)


def unpack_lane_bits(data: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [64, nbytes] -> element codes [64, nbytes*8/bits] (little-endian bit string)."""
    bitv = np.unpackbits(data, axis=1, bitorder="little")
    n = bitv.shape[1] // bits
    return (bitv[:, : n * bits].reshape(64, n, bits).astype(np.uint32)
            << np.arange(bits, dtype=np.uint32)).sum(axis=2, dtype=np.uint32)


def pack_lane_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of unpack_lane_bits: codes [64, N] -> uint8 [64, N*bits/8]."""
    bitv = ((codes[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(bitv.reshape(64, -1), axis=1, bitorder="little")


def ds_read_tr(data: np.ndarray, bits: int) -> np.ndarray:
    """data: the bytes each lane's address points at, uint8 [64, 8 or 12].
    Returns the destination VGPRs as uint32 [nregs, 64]."""
    src_lane, src_item = _tr_index(bits)
    codes = unpack_lane_bits(np.asarray(data, np.uint8), bits)
    out = pack_lane_bits(codes[src_lane, src_item], bits)
    return np.ascontiguousarray(out).view(np.uint32).T


@handler("ds_read_b64_tr_b4", "ds_read_b64_tr_b8", "ds_read_b64_tr_b16", "ds_read_b96_tr_b6")
def _build(ins):
    """ds_read_b64_tr_b{4,8,16} / ds_read_b96_tr_b6 vdst, vaddr [offset:N]."""
    bits = int(ins.base.rsplit("_b", 1)[1])
    nbytes = TR_BYTES[bits]
    addr = R.src(ins, 1, "u32")
    off = int(ins.mods.get("offset", 0))
    put = R.dst_vec(ins, 0)
    keys = R.reg_keys(ins, 0)

    def run(w):
        # ISA: EXEC must be all ones; inactive lanes would feed garbage to others
        data = lds.load(w, addr(w).astype(np.int64) + off, nbytes)
        wl = w.T.wave
        put(w, np.concatenate([ds_read_tr(data[i:i + wl], bits) for i in range(0, w.n, wl)], axis=1).T)
        race.track_load(w, ins, "lgkm", keys)
    return run
