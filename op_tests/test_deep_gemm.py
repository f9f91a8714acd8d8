"""deep_gemm_fp8_grouped_gemm (mxgemm.deep_gemm): hardware check + benchmark vs aiter's CK MoE stage 1.

On an MI355X (gfx950 GPU, ROCm torch), for each DeepSeek-V3 shape (N x K = 2048 x 7168 and
7168 x 2304), E = 8 groups and m rows per group, in the contiguous layout (groups padded to
128 rows, padding rows -1) and the masked one (M_max = m), it checks the op against
mxgemm.reference (bitwise, on the first 256 columns) and times it with CUDA events (median of
100 calls, weights rotated through > 512 MB so every call streams them from HBM). It prints µs,
TFLOPS (2 * E * m * N * K: real rows only) and TB/s (a, b and scales read once, d written) for
the default tile (every registered tile with --all-configs), next to aiter's CK MoE stage 1
(aiter.ck_moe_stage1_fwd with 128x128 FP8 block scales, the same E * m tokens routed top-1,
m to each expert; its argument conventions follow aiter's op_tests/test_moe_2stage.py and were
not run here: no GPU on the machines that develop mxgemm):

    python op_tests/test_deep_gemm.py                        # m in 64..512, both shapes, both layouts
    python op_tests/test_deep_gemm.py -m 64 256 --shapes 2048x7168 --scales ue8m0 --all-configs

Without a GPU (or with --emulator) it runs small cases on the emulator (contiguous with fp32
scales, masked with packed UE8M0 scales) against the reference, so the script cannot rot.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch

import mxgemm.deep_gemm as deep_gemm
from mxgemm import formats, reference, registry, toolchain
from mxgemm.deep_gemm.utils import per_block_cast_to_fp8, per_token_cast_to_fp8

SCALES = ("fp32", "ue8m0", "packed")  # DeepGEMM's SM90 recipe; e8m0 bytes; SM100's packed int32


def inputs(E, m, N, K, masked, scales, device, copies=1, seed=0):
    """(a, sfa, [(b, sfb)] * copies, layout, d) as DeepGEMM's tests build them."""
    g = torch.Generator().manual_seed(seed)
    rows = (E, m) if masked else (E * deep_gemm.align(m, deep_gemm.get_mk_alignment_for_contiguous_layout()),)
    ue8m0 = scales != "fp32"
    a, sfa = per_token_cast_to_fp8(torch.randn(*rows, K, generator=g).view(-1, K), ue8m0)
    a, sfa = a.view(*rows, K), sfa.view(*rows, -1)
    if masked:
        layout = torch.full((E,), m, dtype=torch.int32)
    else:
        per_group = rows[0] // E
        layout = torch.where(torch.arange(rows[0]) % per_group < m,
                             torch.arange(rows[0]) // per_group, -1).int()
    bs = []
    for _ in range(copies):
        qs = [per_block_cast_to_fp8(torch.randn(N, K, generator=g), ue8m0) for _ in range(E)]
        bs.append((torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])))
    if scales == "ue8m0":
        sfa, bs = formats.encode_e8m0(sfa), [(b, formats.encode_e8m0(s)) for b, s in bs]
    elif scales == "packed":  # sfb one scale per row of b, as DeepGEMM's packed recipe
        pack = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor
        sfa = pack(sfa)
        bs = [(b, pack(s.repeat_interleave(128, dim=1)[:, :N])) for b, s in bs]
    d = torch.zeros(*rows, N, dtype=torch.bfloat16)
    mv = lambda t: t.to(device)  # noqa: E731
    return mv(a), mv(sfa), [(mv(b), mv(s)) for b, s in bs], mv(layout), mv(d)


def run(a, sfa, b, sfb, layout, d, masked, config=""):
    if masked:
        deep_gemm.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, layout, int(layout.max()), config=config)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout, config=config)


def unpacked(sf, k_blocks):
    """The reference's scales: packed int32 -> e8m0 bytes per row; others as they are."""
    return torch.empty(sf.shape, dtype=sf.dtype).copy_(sf).view(torch.uint8)[..., :k_blocks] \
        if sf.dtype == torch.int32 else sf


def check(a, sfa, b, sfb, layout, d, masked, cols=256) -> str:
    """Bitwise vs the reference on the written rows and the first ``cols`` columns."""
    K, n = a.shape[-1], min(cols, b.shape[1])
    cpu = [t.cpu() for t in (a, sfa, b, sfb, layout, d)]
    a, sfa, b, sfb, layout, d = cpu
    kb = K // 128
    b, sfb = b[:, :n], unpacked(sfb, kb)[:, :n if sfb.dtype == torch.int32 else -(-n // 128)]
    sfa = unpacked(sfa, kb)
    if masked:
        ref = reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, layout)
        written = torch.arange(a.shape[1])[None, :] < layout[:, None]
    else:
        ref = reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, layout)
        written = layout >= 0
    bad = int((d[..., :n][written].view(torch.int16) != ref[written].view(torch.int16)).sum())
    return f"{'ok' if bad == 0 else 'FAIL'}: {bad} of {int(written.sum()) * n} elements differ from the reference"


def aiter_stage1(a, sfa, b, m_indices, E, m):
    """aiter's CK MoE stage 1 on the same GEMM (contiguous inputs, fp32 scales): the E * m real
    rows as tokens, token t routed (top-1) to expert t // m. Returns a callable taking the
    weight copy index; raises if aiter is missing."""
    import aiter
    from aiter.fused_moe import moe_sorting
    from aiter.ops.shuffle import shuffle_weight
    K, real = a.shape[-1], m_indices >= 0
    tok, tok_sf = a[real], sfa[real]
    ids = m_indices[real].view(-1, 1)
    srt = moe_sorting(ids, torch.ones(E * m, 1, device=a.device), E, K, torch.bfloat16)
    w1 = [shuffle_weight(w, (16, 16)) for w, _ in b]
    w2 = torch.empty(E, K, b[0][0].shape[1] // 2, dtype=b[0][0].dtype, device=a.device)  # stage 1 reads its shape
    out = torch.empty(E * m, 1, b[0][0].shape[1] // 2, dtype=torch.bfloat16, device=a.device)
    a_sf = tok_sf.t().contiguous()

    def call(i):
        aiter.ck_moe_stage1_fwd(tok, w1[i], w2, srt[0], srt[2], srt[3], out, 1, "", b[i][1], a_sf, 64, None,
                                aiter.QuantType.per_128x128, aiter.ActivationType.Silu)
    return call


def hardware(ms, shapes, scales, all_configs):
    from test_smallm_mxfp8 import bench  # the benchmark helper of the dense script beside this one
    E = 8
    print(f"{'m':>4} {'N':>5} {'K':>5} {'layout':>10} {'impl':>16} {'us':>9} {'TFLOPS':>7} {'TB/s':>6}  check / plan")
    for N, K in shapes:
        copies = max(1, (512 << 20) // (E * N * K))
        for m in ms:
            for masked in (False, True):
                a, sfa, bs, layout, d = inputs(E, m, N, K, masked, scales, "cuda", copies)
                plan = deep_gemm.explain(deep_gemm.m_grouped_fp8_gemm_nt_masked if masked else
                                         deep_gemm.m_grouped_fp8_gemm_nt_contiguous, (a, sfa), bs[0], d, layout,
                                         *((m,) if masked else ()))
                tiles = [""] + (sorted({f"{v['BM']}x{v['BN']}" for v in registry.get("blockscale_grouped_gemm").variants
                                        if N % v["BN"] == 0}) if all_configs else [])
                runs = {f"mxgemm {t or 'default'}": (lambda i, t=t: run(a, sfa, *bs[i], layout, d, masked, t))
                        for t in tiles}
                if not masked and scales == "fp32":
                    try:
                        runs["aiter ck stage1"] = aiter_stage1(a, sfa, bs, layout, E, m)
                    except Exception as e:  # aiter missing, or its API moved
                        print(f"(aiter peer unavailable: {type(e).__name__}: {e})")
                flops = 2 * E * m * N * K
                nbytes = E * m * K + E * N * K + 2 * E * m * N + sfa.numel() * sfa.element_size() + \
                    bs[0][1].numel() * bs[0][1].element_size()  # real rows of a and d
                for name, fn in runs.items():
                    try:
                        us = bench(fn, copies)
                    except Exception as e:  # a peer that fails on these inputs
                        print(f"({name} failed: {type(e).__name__}: {e})")
                        continue
                    note = ""
                    if name == "mxgemm default":
                        run(a, sfa, *bs[0], layout, d, masked)
                        note = f"{check(a, sfa, *bs[0], layout, d, masked)}  [{plan.variant}]"
                    print(f"{m:>4} {N:>5} {K:>5} {'masked' if masked else 'contiguous':>10} {name:>16} {us:>9.2f} "
                          f"{flops / us / 1e6:>7.1f} {nbytes / us / 1e6:>6.2f}  {note}", flush=True)


def emulator_smoke() -> int:
    """The small emulator cases; 1 (the exit status) if any is outside the op's promise."""
    from test_smallm_mxfp8 import report  # the dense script beside this one

    def case(E, m, masked, scales):
        def run_case():
            a, sfa, [(b, sfb)], layout, d = inputs(E, m, 64, 256, masked, scales, "cpu")
            if masked:
                layout[1] = 0  # an empty group
            run(a, sfa, b, sfb, layout, d, masked)
            return check(a, sfa, b, sfb, layout, d, masked)
        return run_case
    return report({f"{name} N=64 K=256": case(E, m, masked, scales)
                   for name, E, m, masked, scales in (("contiguous fp32 E=3 m=40", 3, 40, False, "fp32"),
                                                      ("masked packed-ue8m0 E=3 m=40", 3, 40, True, "packed"))})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", type=int, nargs="*", default=[64, 128, 256, 512], help="rows per group")
    p.add_argument("--shapes", nargs="*", default=["2048x7168", "7168x2304"], help="NxK")
    p.add_argument("--scales", choices=SCALES, default="fp32")
    p.add_argument("--all-configs", action="store_true", help="time every registered tile, not only the default")
    p.add_argument("--emulator", action="store_true", help="run the small emulator cases only")
    args = p.parse_args(argv)
    if args.emulator or toolchain.gpu_arch() != "gfx950":
        sys.exit(emulator_smoke())
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    hardware(args.m, shapes, args.scales, args.all_configs)


if __name__ == "__main__":
    main()
