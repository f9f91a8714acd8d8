"""Inputs that run every variant of every gfx950 kernel through its public op: small shapes
that reach each kernel's code paths (partial tiles, loop remainders, empty groups). Each runner
takes the variant and returns the outputs it produced. Used by the race-deletion sweep and by
the GPU launch path's test (mock HIP runtime vs the emulator path)."""
import torch

import mxgemm
from mxgemm import quant, routing


def _mx(rows, k, seed, fmt="e4m3"):
    g = torch.Generator().manual_seed(seed)
    return quant.quantize_mx(torch.randn(rows, k, generator=g), fmt)


def _weights(T):
    return torch.rand(T, 1, generator=torch.Generator().manual_seed(10)) + 0.5


def _dequant(language):
    def run(v):
        x, s = _mx(9, 128, 0)  # 1152 elements: one full workgroup (4 per thread), one partial
        return [mxgemm.mxfp8_dequantize(x, s, language=language)]
    return run


def _smallm(kernel):
    def run(v):  # one workgroup; K covers several K steps per lane (GEMV) / per slice (MFMA)
        m = v["M_TILE"]
        n = 16 * v["N_SUB"] if "N_SUB" in v else 64 // v["SPLIT_K"]
        k = 1024 if "N_SUB" in v else 256 * v["SPLIT_K"]
        a, sa = _mx(m, k, 1)
        b, sb = _mx(n, k, 2)
        return [mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config={"kernel": kernel, **v}, fallback="error")]
    return run


def _moe_mxfp8(v):  # expert 0: 6 real rows + 2 padding rows (two live M_CHUNKs); expert 1: one row
    T, K, N = 7, 256, v["BLOCK_N"]
    ids = torch.tensor([[0], [0], [0], [1], [0], [0], [0]])
    srt = routing.moe_sorting(ids, _weights(T), 2, block_m=8)
    a, sa = _mx(T, K, 3)
    w, sw = _mx(2 * N, K, 4)
    return [mxgemm.moe_mxfp8_grouped_gemm(a, sa, w.view(2, N, K), sw.view(2, N, K // 32), srt.sorted_token_ids,
                                  srt.sorted_expert_ids, srt.num_valid_ids, topk_weights=srt.sorted_weights
                                  .new_ones(T, 1), block_m=8, config=v, fallback="error")]


def _a4w4(backend):
    def run(v):  # 20 real rows in one expert: both m-tiles of BM=32 live; K = 3 steps (pair loop + tail)
        T, K, N = 20, 768, 256
        srt = routing.moe_sorting(torch.zeros(T, 1, dtype=torch.int64), _weights(T), 1,
                                  block_m=v["BM"])
        a, sa = _mx(T, K, 5, "e2m1")
        w, sw = _mx(N, K, 6, "e2m1")
        out = torch.zeros(T, N, dtype=torch.bfloat16)
        mxgemm.moe_gemm2_a4w4(a, sa, w[None], sw[None], srt.sorted_token_ids, srt.sorted_expert_ids,
                              srt.num_valid_ids, srt.sorted_weights, out, block_m=v["BM"], nt=v["NT"],
                              backend=backend)
        return [out]
    return run


def _grouped_fp8(v):
    """TN: sizes that make the op pick variant v, one K step + a 2-row tail, then a short group.
    NT / NN (variant forced by config, a persistent grid of 1): nine groups, so the group scans
    run the compiler's 8- and 4-unrolled bodies and their remainders, of sizes bm + 2, 0 x 7 and
    bm - 2 (a partial second row tile); K = three steps, so the K loop runs its 2-unrolled body
    and its remainder step."""
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    qa, qb = (lambda *s, f=f: torch.randn(*s, generator=torch.Generator().manual_seed(7)).to(fp8[v[f]])
              for f in ("FMT", "FMT_B"))
    bm, bn, one = v["BM"], v["BN"], torch.ones(1)
    kw = dict(out_dtype=torch.bfloat16 if v["OUT"] == "bf16" else torch.float16)
    if v["LAYOUT"] == "TN":
        lens = torch.tensor([130, 3])
        args, op = (qa(133, bm), one, qb(133, bn), one, lens), "grouped_gemm_fp8_variable_k"
    else:
        lens, trans_b, K = torch.tensor([bm + 2] + [0] * 7 + [bm - 2]), v["LAYOUT"] == "NT", 384
        args, op = (qa(2 * bm, K), one, qb(9, bn, K) if trans_b else qb(9, K, bn), one, lens), \
            "grouped_gemm_fp8_kernel"
        kw.update(trans_b=trans_b, num_cu=1, config=dict(BM=bm, BN=bn, GROUP_M=2, PERSISTENT=0))
    assert mxgemm.explain(op, *args, **kw).variant == v
    return [getattr(mxgemm, op)(*args, **kw)]


def _deep_gemm(v):
    """Groups of 40, 0 and 23 rows (full, skipped and partial BM tiles; masked, or contiguous with
    each group padded to 128 rows), K = 1, 6 and 7 blocks, the 7th partial (the compiler unrolls
    the K loop: 6 and 7 leave remainder steps for unroll factors 2 and 4; with 6 the dead
    prefetch DMA of the last step lands in LDS buffer 0, where the epilogue's C tile goes; 1
    takes the path that skips the unrolled loop)."""
    return [_deep_gemm_k(v, K) for K in (128, 768, 848)]


def _deep_gemm_k(v, K):
    g = torch.Generator().manual_seed(7)
    G, m_max, N = 3, 40, v["BN"]
    group_rows = torch.tensor([40, 0, 23], dtype=torch.int32)
    if v["MASKED"]:
        rows, layout = (G, m_max), group_rows
    else:
        rows, layout = (G * 128,), torch.arange(G, dtype=torch.int32).repeat_interleave(128)
        layout[torch.arange(G * 128) % 128 >= group_rows.repeat_interleave(128)] = -1
    a = torch.randn(*rows, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(G, N, K, generator=g).to(torch.float8_e4m3fn)
    sf = (lambda *s: torch.randint(120, 134, s, generator=g, dtype=torch.uint8)) if v["UE8M0"] else \
        (lambda *s: torch.rand(*s, generator=g) + 0.5)
    out = torch.zeros(*rows, N, dtype=torch.bfloat16 if v["OUT"] == "bf16" else torch.float16)
    args = (a, sf(*rows, -(-K // 128)), b, sf(G, -(-N // 128), -(-K // 128)), layout, out)
    kw = dict(masked=bool(v["MASKED"]), config=f"{v['BM']}x{v['BN']}")
    assert mxgemm.explain("deep_gemm_fp8_grouped_gemm", *args, **kw).variant == v
    mxgemm.deep_gemm_fp8_grouped_gemm(*args, **kw)
    return out


def _mx_gemm(v):
    """One workgroup with a partial row and column tile; 3 and 4 K steps per split (odd and even:
    the compiler unrolls the K loop by 2), two K splits for SPLITK variants; then a workgroup
    with no K step (K = 0, or a K split past the last step), whose epilogue waits alone for
    the kernel arguments."""
    splits = 2 if v["SPLITK"] else 1
    cases = [(128 * steps * splits, splits) for steps in (3, 4)] + [(384, 4) if v["SPLITK"] else (0, 1)]
    outs = []
    for K, splits in cases:
        a, sa = _mx(v["BM"] - 3, K, 8, v["A_FMT"])
        b, sb = _mx(max(32, v["BN"] - 32), K, 9, v["B_FMT"])
        kw = dict(a_format=v["A_FMT"], b_format=v["B_FMT"],
                  out_dtype={"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[v["OUT"]],
                  config={"BM": v["BM"], "BN": v["BN"], "SPLITS": splits})
        assert mxgemm.explain("mx_gemm", a, sa, b, sb, **kw).variant == v
        outs.append(mxgemm.mx_gemm(a, sa, b, sb, **kw))
    return outs


RUNNERS = {
    "mxfp8_dequant": _dequant("hip"), "mxfp8_dequant_flydsl": _dequant("flydsl"),
    "smallm_mxfp8_gemv": _smallm("smallm_mxfp8_gemv"), "smallm_mxfp8_mfma": _smallm("smallm_mxfp8_mfma"),
    "smallm_mxfp8_moe_grouped_gemm": _moe_mxfp8,
    "moe_gemm2_a4w4": _a4w4("hip"), "moe_gemm2_a4w4_flydsl": _a4w4("flydsl"),
    "grouped_gemm_fp8": _grouped_fp8,
    "deep_gemm_fp8": _deep_gemm,
    "mx_gemm": _mx_gemm,
}
