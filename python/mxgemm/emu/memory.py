"""Global memory: the buffers a launch registers (host tensors by address, sparse buffers at
fake addresses), gathered and scattered per lane; accesses outside them fault."""
from __future__ import annotations

import bisect
import ctypes

import numpy as np

from .isa import EmulatorFault, u64
from .lds import AR
from .memfault import outside_buffers


class SparseBuffer:
    """Lazily paged device buffer (may exceed 4 GB); unwritten pages read as zero."""
    PAGE = 1 << 16

    def __init__(self, nbytes: int, address: int):
        self.nbytes, self.address, self.pages = int(nbytes), int(address), {}

    def _page(self, p, create):
        pg = self.pages.get(p)
        if pg is None and create:
            pg = self.pages[p] = np.zeros(self.PAGE, np.uint8)
        return pg

    def write(self, off: int, data):
        b = _bytes_of(data)
        if off < 0 or off + b.size > self.nbytes:
            raise EmulatorFault(f"sparse buffer write [{off}, {off + b.size}) outside {self.nbytes} bytes")
        self.scatter(off + np.arange(b.size, dtype=np.int64), b)

    def read(self, off: int, n: int):
        import torch
        if off < 0 or off + n > self.nbytes:
            raise EmulatorFault(f"sparse buffer read [{off}, {off + n}) outside {self.nbytes} bytes")
        return torch.from_numpy(self.gather(off + np.arange(n, dtype=np.int64)).copy())

    def gather(self, idx):
        out = np.zeros(idx.shape, np.uint8)
        pages = idx >> 16
        for p in np.unique(pages):
            pg = self._page(int(p), False)
            if pg is not None:
                sel = pages == p
                out[sel] = pg[idx[sel] & 0xFFFF]
        return out

    def scatter(self, idx, vals):
        pages = idx >> 16
        for p in np.unique(pages):
            sel = pages == p
            self._page(int(p), True)[idx[sel] & 0xFFFF] = vals[sel]


def _bytes_of(data):
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    import torch
    if isinstance(data, torch.Tensor):
        t = data.detach().contiguous().cpu()
        return t.reshape(-1).view(torch.uint8).numpy()
    return np.frombuffer(bytes(data), np.uint8)


class _Region:
    __slots__ = ("base", "size", "arr", "sparse")

    def __init__(self, base, size, arr=None, sparse=None):
        self.base, self.size, self.arr, self.sparse = base, size, arr, sparse

    def gather(self, idx):
        return self.arr[idx] if self.sparse is None else self.sparse.gather(idx)

    def scatter(self, idx, vals):
        if self.sparse is None:
            self.arr[idx] = vals
        else:
            self.sparse.scatter(idx, vals)


class Memory:
    """Registered global memory regions addressed by real (or fake, for sparse) addresses."""

    def __init__(self):
        self.regions, self.bases = [], []
        self.tracer = None      # mxgemm.timing.trace.Tracer of a timed launch

    def add(self, base, size, arr=None, sparse=None):
        for r in self.regions:
            if r.base <= base and base + size <= r.base + r.size:
                return
        i = bisect.bisect(self.bases, base)
        self.regions.insert(i, _Region(base, size, arr, sparse))
        self.bases.insert(i, base)

    def add_host(self, ptr, size):
        if size:
            arr = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
            self.add(ptr, size, arr)

    def _find(self, lo, hi):
        i = bisect.bisect(self.bases, lo) - 1
        if i >= 0:
            r = self.regions[i]
            if hi <= r.base + r.size:
                return r
        return None

    def _split(self, addr, mask, nbytes):
        """Yield (region, lane mask) for the active lanes; faults on unmapped lanes."""
        a = addr[mask]
        if a.size == 0:
            return
        r = self._find(int(a.min()), int(a.max()) + nbytes)
        if r is not None:
            yield r, mask
            return
        left = mask.copy()
        for lane in np.nonzero(mask)[0]:
            if not left[lane]:
                continue
            r = self._find(int(addr[lane]), int(addr[lane]) + nbytes)
            if r is None:
                raise outside_buffers(self.regions, int(lane), int(addr[lane]), nbytes)
            sel = left & (addr >= u64(r.base)) & (addr + u64(nbytes) <= u64(r.base + r.size))
            left &= ~sel
            yield r, sel

    def load(self, addr, mask, nbytes):
        """uint8 [lanes, nbytes] (addr: uint64 [lanes]); inactive lanes read 0."""
        addr = np.asarray(addr, u64)
        if self.tracer is not None:
            self.tracer.vmem(addr, mask, self.bases)
        out = None
        for r, sel in self._split(addr, mask, nbytes):
            off = np.where(sel, addr - u64(r.base), 0).astype(np.int64)
            data = r.gather(off[:, None] + AR[nbytes])
            if out is None and sel is mask:
                return data
            if out is None:
                out = np.zeros((addr.size, nbytes), np.uint8)
            out[sel] = data[sel]
        return out if out is not None else np.zeros((addr.size, nbytes), np.uint8)

    def store(self, addr, mask, data):
        addr = np.asarray(addr, u64)
        if self.tracer is not None:
            self.tracer.vmem(addr, mask, self.bases)
        nbytes = data.shape[1]
        for r, sel in self._split(addr, mask, nbytes):
            off = (addr[sel] - u64(r.base)).astype(np.int64)
            r.scatter(off[:, None] + AR[nbytes], data[sel])

    def atomic(self, addr, mask, dtype, fn):
        """Lane-ordered read-modify-write: new = fn(old, lanes) on the lanes' elements of
        dtype; lanes hitting the same address apply one after another. Returns old [lanes]."""
        dt = np.dtype(dtype)
        n = dt.itemsize
        addr = np.asarray(addr, u64)
        if self.tracer is not None:
            self.tracer.vmem(addr, mask, self.bases)
        old = np.zeros(addr.size, dt)
        act = np.nonzero(mask)[0]
        if act.size == 0:
            return old
        groups = [act] if np.unique(addr[act]).size == act.size else [np.array([l]) for l in act]
        for lanes in groups:
            m = np.zeros(addr.size, bool)
            m[lanes] = True
            cur = self.load(addr, m, n)[lanes].reshape(-1).view(dt)
            old[lanes] = cur
            new = np.asarray(fn(cur, lanes), dt)
            buf = np.zeros((addr.size, n), np.uint8)
            buf[lanes] = new.view(np.uint8).reshape(-1, n)
            self.store(addr, m, buf)
        return old
