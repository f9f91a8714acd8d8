"""a4w4 MXFP4 MoE down-projection (gemm2) on the Kimi-K2.5 MoE (E 385, top-9, hidden 7168, inter 512).

Ours: ``mxgemm.moe_gemm2_a4w4`` with the peer's output, a bf16 row per (token, slot) (``out``
``[T, topk, N]``), timed twice, forced to each kernel (``language="hip"`` and ``"flydsl"``, the
bit-identical FlyDSL port); the row's ``ours_*`` keys are the faster one's. The HIP kernel is timed
a third time summing the top-k into ``out [T, N]`` with its atomics (``hip_atomic_us``).
The peer is the Triton fused-MoE GEMM of vLLM's ``fused_moe_kernel`` design as AMD's aiter ships
it for MXFP4 x MXFP4 (``_fused_moe_kernel_mxfp4``, ``tl.dot_scaled`` e2m1 x e2m1): a tile of
BLOCK_M sorted (token, slot) rows x BLOCK_N columns of one expert, the whole K loop, the top-k
weight applied in the epilogue and one bf16 row per (token, slot) stored (the top-k reduction,
``moe_sum``, is a further launch, not timed here). Written here after that design, config from
aiter's tuned table gfx950-MOE-MX_FP4.json, picked by token count as aiter does (docs/peers/moe_a4w4.md).

Both sides launch only the workgroups that hold routed rows: the sorted buffers are cut at the
padded row count (ours: a legal layout, blocks = rows / BM; the peer: its grid of live tiles, which
its program-id remap computes anyway). The workgroups cut would only exit, which the model charges
nothing for (no dispatch cost, docs/timing_model.md §6), but round sampling would let a live round
stand for them (§3). Timing samples ``ROUNDS`` rounds of XCD 0, so outputs are incomplete: the
products are compared on a functional run of the tiles that hold token 0 (all its top-k rows,
columns 0..255) on both sides, same programs, same inputs.
"""
from __future__ import annotations

import functools

import torch

from ... import quant, routing
from ...specs.base import Inputs
from ...specs.moe_a4w4 import KERNELS, KIMI_K25
from . import compile_as_launched, launch_triton, time_ours

# aiter's gfx950-MOE-MX_FP4.json: small_M below 256 tokens, medium_M below 1024, large_M above
# (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages; waves_per_eu 0, matrix_instr_nonkdim 16, kpack 1)
PEER_CONFIGS = (
    (256, dict(BM=64, BN=64, BK=128, GROUP_M=2), 4, 4),
    (1024, dict(BM=128, BN=128, BK=128, GROUP_M=4), 8, 2),
    (None, dict(BM=128, BN=128, BK=128, GROUP_M=8), 8, 4),
)
PEER = ("Triton fused-MoE MXFP4 gemm (vLLM's fused_moe_kernel design, aiter's _fused_moe_kernel_mxfp4: "
        "tl.dot_scaled e2m1 x e2m1), aiter's gfx950 table: 64/64/128 4 warps 4 stages below 256 tokens, "
        "128/128/128 8 warps from 1024")
TOKENS = (1, 16, 128, 1024, 4096)
ROUNDS = 2          # rounds of XCD 0 simulated: the cut grids are live end to end, and a round of the peer's
                    # 8-wave tiles takes the emulator minutes (§3: 2 rounds of a uniform grid within 10 %)
CHECK_COLUMNS = 256
XCDS = 8            # aiter's NUM_XCDS on gfx950: the kernel remaps program ids so that an XCD's tiles are adjacent


def peer_config(tokens: int) -> tuple:
    """(blocks, warps, stages) aiter picks for ``tokens``."""
    return next((b, w, s) for limit, b, w, s in PEER_CONFIGS if limit is None or tokens < limit)


def block_m(tokens: int, topk: int, experts: int) -> int:
    """Our routing block: 16 while the routed rows average at most 16 per expert (decode), else 64
    (docs/peers/moe_a4w4.md § "A row per route": BM 32 / 64 / 128 at T 1024 and 4096)."""
    return 16 if tokens * topk <= 16 * experts else 64


@functools.lru_cache(maxsize=None)
def _fused_moe_mxfp4():
    import triton
    import triton.language as tl

    @triton.jit
    def fused_moe_mxfp4(a, a_scale, w, w_scale, topk_weights, sorted_ids, expert_ids, padded_rows, c,
                        N, K, num_valid, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr):
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(tl.load(padded_rows), BM)
        num_pid_n = tl.cdiv(N, BN)
        tiles = num_pid_m * num_pid_n
        if pid >= tiles:        # the grid is sized for the worst-case padding: the rest exit
            return
        # consecutive ids land on different XCDs: give each XCD a contiguous range of tiles
        per_xcd = tl.cdiv(tiles, NUM_XCDS)
        tall = tiles % NUM_XCDS
        tall = NUM_XCDS if tall == 0 else tall
        xcd, local = pid % NUM_XCDS, pid // NUM_XCDS
        if xcd < tall:
            pid = xcd * per_xcd + local
        else:
            pid = tall * per_xcd + (xcd - tall) * (per_xcd - 1) + local
        # GROUP_M row blocks share each column block before moving on (L2 reuse of the weights)
        group = pid // (GROUP_M * num_pid_n)
        first_m = group * GROUP_M
        rows_in_group = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + pid % rows_in_group
        pid_n = (pid % (GROUP_M * num_pid_n)) // rows_in_group

        rows = tl.load(sorted_ids + pid_m * BM + tl.arange(0, BM))       # (token * topk + slot), padding num_valid
        live = rows < num_valid
        expert = tl.load(expert_ids + pid_m).to(tl.int64)
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk, rs = tl.arange(0, BK // 2), tl.arange(0, BK // 32)
        x_ptr = a + rows[:, None] * (K // 2) + rk[None, :]
        xs_ptr = a_scale + rows[:, None] * (K // 32) + rs[None, :]
        y_ptr = w + expert * N * (K // 2) + rn[:, None] * (K // 2) + rk[None, :]
        ys_ptr = w_scale + expert * N * (K // 32) + rn[:, None] * (K // 32) + rs[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K // BK):
            x = tl.load(x_ptr, mask=live[:, None], other=0)
            xs = tl.load(xs_ptr, mask=live[:, None], other=0)
            y = tl.load(y_ptr)
            ys = tl.load(ys_ptr)
            acc = tl.dot_scaled(x, xs, "e2m1", y.T, ys, "e2m1", acc=acc, fast_math=True)
            x_ptr += BK // 2
            xs_ptr += BK // 32
            y_ptr += BK // 2
            ys_ptr += BK // 32
        acc = acc * tl.load(topk_weights + rows, mask=live, other=0)[:, None]
        cn = pid_n * BN + tl.arange(0, BN)
        tl.store(c + rows[:, None] * N + cn[None, :], acc.to(tl.bfloat16), mask=live[:, None] & (cn[None, :] < N))

    return fused_moe_mxfp4


def peer_routing(ids, weights, experts: int, bm: int) -> tuple:
    """vLLM's moe_align_block_size layout for the peer, from the same routing, cut at the padded
    rows: (sorted rows token * topk + slot, padding T * topk; expert per BM block; [padded rows];
    weights per row [T * topk])."""
    T, topk = ids.shape
    s = routing.moe_sorting(ids, weights, experts, block_m=bm)
    tok, slot = routing.decode_sorted_id(s.sorted_token_ids)
    rows = torch.where(tok < T, tok * topk + slot, T * topk).to(torch.int32)
    n = int(s.num_valid_ids[0])
    return (rows[:n], s.sorted_expert_ids[:n // bm], s.num_valid_ids[:1].clone(),
            weights.reshape(-1).float().contiguous())


def peer_tiles(m_blocks: int, n_blocks: int, group_m: int) -> torch.Tensor:
    """[pid] -> (row block, column block) as the peer's remap computes them (the inverse: which
    program ids hold given tiles)."""
    pid = torch.arange(m_blocks * n_blocks)
    tiles = m_blocks * n_blocks
    per_xcd, tall = -(-tiles // XCDS), tiles % XCDS or XCDS
    xcd, local = pid % XCDS, pid // XCDS
    pid = torch.where(xcd < tall, xcd * per_xcd + local, tall * per_xcd + (xcd - tall) * (per_xcd - 1) + local)
    first_m = pid // (group_m * n_blocks) * group_m
    rows_in_group = (m_blocks - first_m).clamp(max=group_m)
    return torch.stack([first_m + pid % rows_in_group, pid % (group_m * n_blocks) // rows_in_group], 1)


def run_peer(x, machine=None, tiles=None) -> tuple:
    """(c [T * topk, N] bf16, timing or None) of the peer on the case ``x`` (``operands``), compiled
    in aiter's config for T as Triton's launcher specialises this call: timed on ``machine`` (XCD 0's
    workgroups: mxgemm.timing.xcd0_rounds), else functional, the whole grid or only the program ids
    holding ``tiles`` ((row block, column block) pairs)."""
    from ...emu import Emulator
    T, topk = x["ids"].shape
    N, K = x["w"].shape[1], x["w"].shape[2] * 2
    blocks, warps, stages = peer_config(T)
    rows, experts, padded, weights = peer_routing(x["ids"], x["weights"], x["w"].shape[0], blocks["BM"])
    c = torch.zeros(T * topk, N, dtype=torch.bfloat16)
    args = dict(a=x["a"], a_scale=x["a_scale"], w=x["w"], w_scale=x["w_scale"], topk_weights=weights,
                sorted_ids=rows, expert_ids=experts, padded_rows=padded, c=c, N=N, K=K, num_valid=T * topk)
    options = (("num_stages", stages), ("waves_per_eu", 0), ("matrix_instr_nonkdim", 16), ("kpack", 1))
    asm, lds, launch = compile_as_launched(_fused_moe_mxfp4(), args, (*blocks.items(), ("NUM_XCDS", XCDS)), warps,
                                           options)
    m_blocks, n_blocks = rows.numel() // blocks["BM"], -(-N // blocks["BN"])
    wgs = None
    if tiles is not None:
        pids = peer_tiles(m_blocks, n_blocks, blocks["GROUP_M"])
        held = (pids[:, None, :] == torch.tensor(tiles)[None]).all(2).any(1)
        wgs = [(p, 0, 0) for p in held.nonzero().flatten().tolist()]
    emu = Emulator(arch="gfx950", race_check=False, timing=machine)
    launch_triton(emu, asm, "fused_moe_mxfp4", launch, (m_blocks * n_blocks,), warps, lds, rounds=ROUNDS, xcd0=True,
                  workgroups=wgs)
    return c, emu.last_timing


def operands(tokens, topk, experts, N, K, seed=0) -> dict:
    """Random finite e2m1 / e8m0 bytes (the values do not change what runs) and a seeded uniform
    routing (distinct experts per token); our sorted layout in block_m(...) blocks, cut at its
    padded rows."""
    inp = Inputs(fill="bytes", seed=seed)
    ids = torch.stack([torch.randperm(experts, generator=inp.gen)[:topk] for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=inp.gen)
    a, sa = inp.mx(tokens * topk, K, fmt="e2m1")
    w, sw = inp.mx(experts, N, K, fmt="e2m1")
    bm = block_m(tokens, topk, experts)
    s = routing.moe_sorting(ids, weights, experts, block_m=bm)
    n = int(s.num_valid_ids[0])
    srt = routing.MoeSorting(s.sorted_token_ids[:n], s.sorted_weights[:n], s.sorted_expert_ids[:n // bm],
                             s.num_valid_ids)
    return dict(a=a, a_scale=sa, w=w, w_scale=sw, ids=ids, weights=weights, srt=srt, block_m=bm)


def ours(x, language: str, route_rows: bool = True) -> tuple:
    """(arguments, keywords) of the public op's call on ``x``, forced to ``language``: out a row per
    route ([T, topk, N], the peer's output), or the top-k summed by atomics ([T, N])."""
    s = x["srt"]
    T, topk = x["ids"].shape
    out = torch.zeros(*((T, topk) if route_rows else (T,)), x["w"].shape[1], dtype=torch.bfloat16)
    return ((x["a"], x["a_scale"], x["w"], x["w_scale"], s.sorted_token_ids, s.sorted_expert_ids, s.num_valid_ids,
             s.sorted_weights, out), dict(language=language, validate=False))


def time_mine(x, language: str, machine="mi355x", route_rows: bool = True) -> tuple:
    """time_ours of our call on XCD 0's workgroups (ROUNDS rounds, or its whole share)."""
    import mxgemm
    args, kw = ours(x, language, route_rows)
    return time_ours(lambda: mxgemm.moe_gemm2_a4w4(*args, **kw), machine, ROUNDS, xcd0=True)


def check_same_product(mine, theirs, topk: int, terms=None) -> None:
    """Ours against the peer's bf16 addends [T * topk, N].

    Ours [T, topk, N], a row per route: each addend apart from the peer's by at most the two bf16
    roundings (2^-8 of each value) plus the two fp32 sums' difference, at most 2^-20 of ``terms``
    ([T * topk, N], the absolute sum of the addend's products: each side adds four 128-product
    chunks at K 512, each rounding at most 2^-24 of that). Ours [T, N] (top-k bf16 atomic adds,
    each rounding its running sum: at most 2^-9 of it, so topk 2^-9 of the addends' absolute sum
    in all): against the addends summed in fp64. A missing, doubled or wrong addend is off by
    about an addend, 1 / topk of that sum on average."""
    if mine.dim() == 3:
        mine, theirs = mine.double().reshape(theirs.shape), theirs.double()
        bound = 2.0 ** -8 * (mine.abs() + theirs.abs()) + (0 if terms is None else 2.0 ** -20 * terms)
        bad = (mine - theirs).abs() > bound
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise AssertionError(f"ours and the peer differ: route row {i // mine.shape[1]}, column "
                                 f"{i % mine.shape[1]}: {float(mine.flatten()[i])} vs {float(theirs.flatten()[i])}")
        return
    addends = theirs.double().reshape(mine.shape[0], topk, -1)
    bound = topk * 2.0 ** -9 * addends.abs().sum(1) + 1e-30
    err = (mine.double() - addends.sum(1)).abs()
    if not bool((err <= bound).all()):
        i = int((err / bound).argmax())
        raise AssertionError(f"ours and the peer differ: token {i // mine.shape[1]}, column {i % mine.shape[1]}: "
                             f"{float(mine.flatten()[i])} vs {float(addends.sum(1).flatten()[i])}")


def cells() -> list:
    return [dict(label=f"Kimi-K2.5 gemm2 T={T} E={KIMI_K25['experts']} top{KIMI_K25['topk']} N={KIMI_K25['N']} "
                       f"K={KIMI_K25['K']}", tokens=T, **KIMI_K25) for T in TOKENS]


def check_token0(x) -> None:
    """Both products on token 0 (its top-k rows, columns 0..CHECK_COLUMNS-1), each side running
    only the workgroups that hold them, functionally."""
    from ... import launcher
    topk = x["ids"].shape[1]
    tok, _ = routing.decode_sorted_id(x["srt"].sorted_token_ids)
    # the row-per-route form's XCD tile order permutes each chunk of 8 row blocks over all columns:
    # run the chunks that hold token 0's blocks
    chunks = sorted({p // x["block_m"] // 8 * 8 for p in (tok == 0).nonzero().flatten().tolist()})
    grid_rows, columns = x["srt"].sorted_expert_ids.numel(), x["w"].shape[1] // 256
    import mxgemm
    args, kw = ours(x, "hip")
    wgs = [(c, y, 0) for first in chunks for y in range(first, min(first + 8, grid_rows)) for c in range(columns)]
    with launcher.emulator_settings(race_check=False, workgroups=wgs):
        mine = mxgemm.moe_gemm2_a4w4(*args, **kw)
    blocks, _, _ = peer_config(x["ids"].shape[0])
    rows, _, _, _ = peer_routing(x["ids"], x["weights"], x["w"].shape[0], blocks["BM"])
    peer_blocks = sorted({p // blocks["BM"] for p in (rows < topk).nonzero().flatten().tolist()})
    theirs, _ = run_peer(x, tiles=[(m, n) for m in peer_blocks for n in range(CHECK_COLUMNS // blocks["BN"])])
    e = x["ids"][0]       # the products' absolute sums of token 0's addends
    a = quant.dequantize_mx(x["a"][:topk], x["a_scale"][:topk], "e2m1").double().abs()
    w = quant.dequantize_mx(x["w"][e, :CHECK_COLUMNS], x["w_scale"][e, :CHECK_COLUMNS], "e2m1").double().abs()
    terms = x["weights"][0].double()[:, None] * torch.einsum("snk,sk->sn", w, a)
    check_same_product(mine[:1, :, :CHECK_COLUMNS], theirs[:topk, :CHECK_COLUMNS], topk, terms)


def run(cell, machine="mi355x") -> dict:
    """Both of ours and the peer on one cell, a row per route each: the products compared on
    token 0 first, then timed (rounds-sampled); and the HIP kernel summing by atomics."""
    x = operands(cell["tokens"], cell["topk"], cell["experts"], cell["N"], cell["K"])
    check_token0(x)
    timed = {lang: time_mine(x, lang, machine) for lang in KERNELS}
    atomic = time_mine(x, "hip", machine, route_rows=False)
    _, tp = run_peer(x, machine)
    best = min(timed, key=lambda lang: timed[lang][1])
    _, us, _, t = timed[best]
    return dict(ours_us=us, peer_us=tp["us"], ours_kernel=KERNELS[best], ours_limiter=t["limiter"],
                peer_limiter=tp["limiter"], sampled=t["sampled"] or tp["sampled"],
                **{f"{lang}_us": timed[lang][1] for lang in KERNELS}, hip_atomic_us=atomic[1],
                **{f"{lang}_hottest": hottest(timed[lang][3]) for lang in KERNELS}, peer_hottest=hottest(tp))


def hottest(timing) -> str:
    """The hottest basic block of a timing: its label, share of the waves' cycles and top stall cause."""
    blocks = timing["breakdown"]["blocks"]
    b = blocks[0]
    cause = max(b["stalls"], key=b["stalls"].get) if b["stalls"] else "issue"
    return f"{b['block']} {b['cycles'] / sum(x['cycles'] for x in blocks):.0%} ({cause})"
