"""Peer HIP kernels on the emulator: kernels of AMD's ROCm examples (tests/emu/peer_hip/, MIT),
compiled with mxgemm's toolchain and launched as their examples' host code launches them, in
race mode, against torch."""
from pathlib import Path

import pytest
import torch

from mxgemm import asm_facts, toolchain
from mxgemm.emu import Emulator

HERE = Path(__file__).parent / "peer_hip"


@pytest.fixture(scope="module")
def prog():
    asm = toolchain.compile_hip_source((HERE / "hip_compat.h").read_text() + (HERE / "rocm_examples.hip").read_text())
    symbols = {n.split("_Z", 1)[1].lstrip("0123456789").split("P")[0]: n for n in asm_facts.kernel_names(asm)}
    emu = Emulator(arch="gfx950", race_check=True)
    return emu, emu.load(asm), symbols


def _launch(prog, name, grid, block, args, lds=0):
    emu, p, symbols = prog
    sym = next(s for k, s in symbols.items() if s.startswith(f"_Z{len(name)}{name}"))
    emu.launch(p, sym, grid=grid, block=block, args=args, dynamic_lds=lds)


def test_histogram256_block(prog):
    """The example's kernel at its block size (128 threads, 256 bins of per-thread byte counters
    in dynamic LDS), 2 blocks of 16 items per thread: per-block bins."""
    g = torch.Generator().manual_seed(0)
    items, threads, blocks = 16, 128, 2
    data = torch.randint(0, 256, (blocks * threads * items,), generator=g, dtype=torch.uint8)
    bins = torch.zeros(blocks * 256, dtype=torch.int32)
    _launch(prog, "histogram256_block", (blocks, 1, 1), (threads, 1, 1), [data, bins, items], lds=256 * threads)
    want = torch.stack([torch.bincount(d.long(), minlength=256) for d in data.view(blocks, -1)]).int()
    assert torch.equal(bins.view(blocks, 256), want)


def test_prefix_sum(prog):
    """The example's multi-pass scan (block_prefix_sum sweeps, then device_prefix_sum fix-ups),
    on small integers (exact in fp32)."""
    size, threads = 256, 128          # the example's default size
    per_block = 2 * threads
    x = torch.randint(0, 8, (size,), generator=torch.Generator().manual_seed(1)).float()
    data = x.clone()
    offset = 1
    while offset < size:
        if size // offset > 1:
            total = -(-((size // offset + 1) // 2) // threads) * threads
            _launch(prog, "block_prefix_sum", (total // threads, 1, 1), (threads, 1, 1), [data, size, offset],
                    lds=4 * 2 * threads)
        if offset > 1:
            total = size - offset
            total -= (total // (offset * per_block)) * offset
            total = -(-total // threads) * threads
            _launch(prog, "device_prefix_sum", (total // threads, 1, 1), (threads, 1, 1), [data, size, offset])
        offset *= per_block
    assert torch.equal(data, torch.cumsum(x, 0))


def test_bitonic_sort(prog):
    """The example's launch sequence: step i, stage j for j <= i, one thread per pair."""
    steps = 9
    n = 1 << steps
    x = torch.randperm(n, generator=torch.Generator().manual_seed(2)).int()
    arr = x.clone()
    for i in range(steps):
        for j in range(i + 1):
            _launch(prog, "bitonic_sort_kernel", (n // 2 // 64, 1, 1), (64, 1, 1), [arr, i, j, 1])
    assert torch.equal(arr, torch.sort(x).values)


def test_warp_shuffle_transpose(prog):
    """The example's single-block 4 x 4 transpose through __shfl (ds_bpermute)."""
    w = 4
    src = torch.arange(w * w, dtype=torch.float32)
    out = torch.zeros(w * w)
    _launch(prog, "matrix_transpose_kernel", (1, 1, 1), (w, w, 1), [out, src, w])
    assert torch.equal(out.view(w, w), src.view(w, w).T)
