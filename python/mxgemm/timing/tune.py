"""`python -m mxgemm tune FAMILY [--shapes MxNxK ...] [--out CSV]`: the autotuner on the timing
model. For each shape it times every candidate config of the family's op (simulated MI355X, the
real assembly on the emulator, rounds-sampled like `python -m mxgemm time`, XCD 0's workgroups
only: the engine replays that XCD), times the peer users run today (mxgemm.timing.peers) in the
same run, checks the fastest config's whole product against the reference and the peer's tiles
against it, and writes the fastest config to the family's tuned CSV (source=simulated) with its
time, the runner-up and the peer's time. Rows of other shapes are kept; rows are written as each
shape finishes; shapes whose row is already simulated are skipped unless --retune. Each shape
also reports whether the planner's heuristic picked a config within 5 % of the best (the
heuristic was written without any timing: every tuned shape is held out from it).

Families:
- smallm (smallm_mxfp8_gemm; python/mxgemm/configs/smallm_mxfp8_gfx950.csv; default shapes: the
  decode linear layers of mxgemm.timing.peers.smallm at M 1, 2, 4, 8, 16, 32, 40, 48, 64: the
  M_TILE boundaries, and 40 / 48 because at M 33-48 a tile below the M 64 row's can be the best
  (three or fewer 16-row blocks, or one 64-row block mostly past M); every M up to 64 finds its
  row at the nearest tuned M above; --shapes MxNxK; candidates: the GEMV and MFMA variants at
  their smallest M_TILE >= M, the MFMA kernel also at each smaller M_TILE, and mx_gemm's tiles
  at its smallest BM >= M).
- moe_mxfp8 (moe_mxfp8_grouped_gemm at block_m 16; python/mxgemm/configs/moe_mxfp8_gfx950.csv;
  default shapes: the cells of mxgemm.timing.peers.moe_mxfp8; --shapes TxTOPKxExNxKxR, R 1 for
  gemm2's call (a row per route, top-k weights, fp32 out), 0 for gemm1's (a row per token, bf16).
  A call finds its row at the nearest tuned token count above).
- grouped_fp8 (train_grouped_gemm's forward / dgrad / wgrad, e4m3 tensorwise to bf16;
  python/mxgemm/configs/train_grouped_gemm_gfx950.csv, rows keyed (layout, G, M, N, K); default
  shapes: the layers of mxgemm.timing.peers.grouped_fp8, all three passes; --shapes
  PASSxGxMxNxK, PASS fwd, dgrad or wgrad, m rows per group of weights [G, N, K]; candidates: the
  heuristic's config and each config one parameter away from it (op.candidates). A call finds its
  row at its exact problem).
- mx_gemm (mx_gemm to bf16, the peer's output; python/mxgemm/configs/dense_mx_gfx950.csv; default
  shapes: the cells of mxgemm.timing.peers.mx_gemm on pre-shuffled scales, the peer's input, then
  on row-major scales; --shapes AxBxMxNxKxS, A and B the formats (e4m3, e2m1), S 1 for shuffled
  scales; candidates: every registered tile (op.candidates). Timed over rounds of the whole grid,
  as `python -m mxgemm time --vs-peers mx_gemm` times it; above 2048^3 the product is checked on
  the first and last row of tiles. A call finds its row at the nearest
  tuned M >= M with the same formats, scale layout, N and K).
- blockscale (deep_gemm_fp8_grouped_gemm, e4m3 with fp32 block scales to bf16, the peer's;
  python/mxgemm/configs/blockscale_grouped_gemm_gfx950.csv; default shapes: the cells of
  mxgemm.timing.peers.blockscale; --shapes MASKEDxGxmxNxK, m rows per group; candidates: the
  registered tiles dividing N (op.candidates). Each side is timed at the two K of
  blockscale.K_SAMPLE and extrapolated to K, as `python -m mxgemm time --vs-peers blockscale`
  does; the product is checked at the larger of them. A call finds its row at the nearest tuned
  M >= M (masked: a group buffer's rows; contiguous: a's rows) with the same G, N and K)."""
from __future__ import annotations

import argparse
import functools
import sys
import time

import torch

from .peers import NoPeer

WITHIN = 0.05          # the heuristic's pick counts as right within this of the best


def _timed(best_us, runner, peer_us, label) -> dict:
    """A simulated row's time columns: ours, the runner-up's config and time, the peer's."""
    return {"us": f"{best_us:.2f}", "source": "simulated", "runner_up": label(*runner[1:]) if runner else "",
            "runner_up_us": f"{runner[0]:.2f}" if runner else "",
            "peer_us": "" if peer_us is None else f"{peer_us:.2f}"}


def _ratio(r) -> str:
    """peer / ours of a row, '-' where the peer is not defined at its shape."""
    return f"{float(r['peer_us']) / float(r['us']):.2f}" if r["peer_us"] else "-"


def _markdown(head, cells, rows) -> str:
    """The simulated rows as markdown: the family's key columns (head; cells(row) -> their values
    and the config's text), then ours, the runner-up, the peer and peer / ours."""
    head = [*head, "ours (us)", "our config", "runner-up (us)", "peer (us)", "peer / ours"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["source"] == "simulated":
            keys, config = cells(r)
            lines.append("| " + " | ".join([*map(str, keys), r["us"], config, r["runner_up_us"], r["peer_us"] or "-",
                                            _ratio(r)]) + " |")
    return "\n".join(lines)


def _smallm():
    from ..ops import smallm_mxfp8 as op
    from .peers import smallm as peer

    def shapes():
        layers = sorted({(N, K) for _, N, K in peer.LAYERS}, key=lambda nk: nk[0] * nk[1])   # smallest first
        return [(M, N, K) for N, K in layers for M in op.TUNED_MS]

    def label(kernel, variant):
        return ",".join([kernel, *(f"{k}={v}" for k, v in variant.items())])

    @functools.lru_cache(maxsize=1)   # one shape's candidates, product and peer share its operands
    def inputs(shape):
        return peer.operands(*shape)

    def call(shape, kernel, variant):
        import mxgemm
        a, sa, b, sb = inputs(shape)
        cfg = {"kernel": kernel, **variant}
        return lambda: mxgemm.smallm_mxfp8_gemm(a, sa, b, sb, config=cfg, fallback="error")

    def run(shape, kernel, variant):
        _, us, _, t = peer.time_ours(call(shape, kernel, variant), rounds=peer.ROUNDS, xcd0=True)
        return us, t["limiter"]

    def product(shape, kernel, variant):
        """The config's whole output (a functional run) and the reference's."""
        from .. import launcher, reference
        with launcher.emulator_settings(race_check=False):
            got = call(shape, kernel, variant)()
        ops = inputs(shape)
        if kernel == op.DENSE:
            return got, reference.mx_gemm_ref(*ops, chunk=reference.MX_MMA_K)
        return got, reference.smallm_mxfp8_gemm_ref(*ops)

    def run_peer(shape):
        out, t = peer.time_peer(*inputs(shape), xcd0=True)
        return t["us"], out

    def heuristic(shape):
        c = op.heuristic_config(*shape)
        if c.kernel == op.DENSE:   # resolved to mx_gemm's whole variant; its candidate names the tile
            return op.DENSE, {p: c.variant[p] for p in ("BM", "BN")}
        return c.kernel, c.variant

    def row(shape, best, runner, peer_us):
        (us, kernel, variant), M, N, K = best, *shape
        r = {"arch": op.ARCH, "M": M, "N": N, "K": K, "kernel": kernel, **_timed(us, runner, peer_us, label)}
        r.update({p: variant.get(p, "") for p in op.CSV_PARAMS})
        return r

    def table(rows):
        """Markdown: a row per simulated shape, ours (tuned) vs the peer, and ours' fraction of the HBM
        roofline (compulsory bytes at 8 TB/s) where the weights exceed 16 MB."""
        from ..asm_facts import LIMITS
        from ..specs.smallm_mxfp8 import compulsory_bytes
        layer = {(N, K): name for name, N, K in peer.LAYERS}
        lines = ["| layer | M | N | K | ours (us) | our config | runner-up (us) | peer (us) | peer / ours | "
                 "of HBM roofline |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["source"] != "simulated":
                continue
            M, N, K, us = int(r["M"]), int(r["N"]), int(r["K"]), float(r["us"])
            roof = f"{compulsory_bytes(M, N, K) / (us * 1e-6) / (LIMITS['gfx950']['hbm_tbps'] * 1e12):.2f}" \
                if N * K * 33 / 32 > 16e6 else ""
            cfg = label(r["kernel"], op._variant_of(r)).replace("smallm_mxfp8_", "")
            lines.append(f"| {layer.get((N, K), '')} | {M} | {N} | {K} | {us:.2f} | {cfg} | {r['runner_up_us']} | "
                         f"{r['peer_us'] or '-'} | {_ratio(r)} | {roof} |")
        return "\n".join(lines)

    return dict(csv=op.CONFIG_CSV, table=table, fields=op.CSV_FIELDS,
                key=lambda r: (r["arch"], *(int(r[d]) for d in "MNK")),
                shape_key=lambda s: (op.ARCH, *s), shapes=shapes, candidates=lambda s: op.candidates(*s),
                run=run, product=product, run_peer=run_peer, heuristic=heuristic, row=row, label=label)


def _moe_mxfp8():
    from ..ops import moe_mxfp8 as op
    from .peers import moe_mxfp8 as peer
    block_m = peer.OUR_BLOCK_M

    def shapes():
        return [(c["tokens"], c["topk"], c["E"], c["N"], c["K"], int(c["per_route"])) for c in peer.cells()]

    def label(kernel, variant):
        return ",".join(f"{k}={v}" for k, v in variant.items())

    def fields(shape) -> dict:
        """A shape's CSV key columns."""
        T, k, E, N, K, per_route = shape
        return {"arch": op.ARCH, "tokens": T, "experts": E, "topk": k, "per_route_a": per_route, "N": N, "K": K,
                "block_m": block_m}

    @functools.lru_cache(maxsize=1)   # one shape's candidates, product and peer share its operands
    def inputs(shape):
        """(topk_ids, layout, a, a_scale, w, w_scale, top-k weights or None) as the peer cells make them."""
        T, k, E, N, K, per_route = shape
        ids, weights, srt = peer.routing(T, k, E)
        return (ids, srt, *peer.operands(T, k, E, N, K, per_route, srt), weights if per_route else None)

    def call(shape, variant):
        _, srt, a, sa, w, sw, tw = inputs(shape)
        return lambda: peer.ours(a, sa, w, sw, srt, shape[1], tw, variant)

    def run(shape, kernel, variant):
        _, us, _, t = peer.time_ours(call(shape, variant), rounds=peer.ROUNDS, xcd0=True)
        return us, t["limiter"]

    def product(shape, kernel, variant):
        from .. import launcher
        T, k, E, N, K, _ = shape
        with launcher.emulator_settings(race_check=False):
            got = call(shape, variant)()
        _, srt, a, sa, w, sw, tw = inputs(shape)
        return got.view(T * k, N), peer.reference(a, sa, w, sw, srt, T, k, tw)

    def run_peer(shape):
        ids, _, a, sa, w, sw, tw = inputs(shape)
        out, t = peer.time_peer(a, sa, w, sw, ids, tw)
        return t["us"], out

    def heuristic(shape):
        T, k, E, N, K, _ = shape
        rows = inputs(shape)[1].sorted_token_ids.numel()
        return op.MOE, op.heuristic_choice(T, k, E, N, K, block_m, rows).variant

    def row(shape, best, runner, peer_us):
        us, _, variant = best
        return {**fields(shape), **variant, **_timed(us, runner, peer_us, label)}

    def table(rows):
        return _markdown(["tokens", "top-k", "E", "N", "K", "a per route"], lambda r: (
            [r[c] for c in ("tokens", "topk", "experts", "N", "K", "per_route_a")],
            f"BLOCK_N {r['BLOCK_N']}, M_CHUNK {r['M_CHUNK']}"), rows)

    def key(r):
        return (r["arch"], *(int(r[c]) for c in ("tokens", *op.CSV_KEY)))

    return dict(csv=op.CONFIG_CSV, table=table, fields=op.CSV_FIELDS, key=key,
                shape_key=lambda s: key(fields(s)), shapes=shapes,
                candidates=lambda s: [(op.MOE, v) for v in op.candidates(s[4], block_m)],
                run=run, product=product, run_peer=run_peer, heuristic=heuristic, row=row, label=label)


def _grouped_fp8():
    from .. import reference
    from ..ops import train_grouped_gemm as op
    from .peers import grouped_fp8 as peer

    def shapes():
        # the layers timed against the peer first (docs/performance.md), then the others
        gemms = peer.TIMED + tuple((m, g) for m, g, _, _ in peer.GEMMS if (m, g) not in peer.TIMED)
        return [(c["pass_"], c["G"], c["m"], c["N"], c["K"]) for c in peer.cells(gemms)]

    def label(kernel, cfg):
        return ",".join(f"{k}={v}" for k, v in cfg.items())

    @functools.lru_cache(maxsize=1)   # one shape's candidates, product and peer share its operands
    def inputs(shape):
        return peer.operands(*shape)

    def run(shape, kernel, cfg):
        pass_ = shape[0]
        _, us, _, t = peer.time_ours(lambda: peer.ours(pass_, *inputs(shape), config=cfg), rounds=peer.ROUNDS,
                                     xcd0=True)
        return us, t["limiter"]

    def product(shape, kernel, cfg):
        from .. import launcher
        pass_ = shape[0]
        a, sa, b, sb, lens = inputs(shape)
        with launcher.emulator_settings(race_check=False):
            got = peer.ours(pass_, a, sa, b, sb, lens, config=cfg)
        offs = op.group_offsets(lens)
        if pass_ == "wgrad":
            return got, reference.grouped_gemm_fp8_variable_k_ref(a, sa, b, sb, offs)
        return got, reference.grouped_gemm_fp8_ref(a, sa, b, sb, offs, trans_b=pass_ == "fwd")

    def run_peer(shape):
        out, t = peer.time_peer(shape[0], *inputs(shape), fill=float("nan"))
        return t["us"], out

    def heuristic(shape):
        return None, op.heuristic_config(*peer.problem(*shape)[:4])

    def row(shape, best, runner, peer_us):
        us, _, cfg = best
        return {**dict(zip(op.KEY, peer.problem(*shape))), **cfg, **_timed(us, runner, peer_us, label)}

    def table(rows):
        return _markdown(list(op.KEY), lambda r: (
            [r[k] for k in op.KEY], f"{r['BM']} x {r['BN']}, GROUP_M {r['GROUP_M']}, PERSISTENT {r['PERSISTENT']}"),
            rows)

    def key(r):
        return op.problem_key(r["layout"], *(int(r[k]) for k in op.KEY[1:]))

    return dict(csv=op.CONFIG_CSV, table=table, fields=op.CSV_FIELDS, key=key,
                shape_key=lambda s: peer.problem(*s), shapes=shapes,
                candidates=lambda s: [(None, c) for c in op.candidates(*peer.problem(*s)[:4])],
                run=run, product=product, run_peer=run_peer, heuristic=heuristic, row=row, label=label)


def _mx_gemm():
    from .. import quant, reference
    from ..ops import dense_mx as op
    from .peers import mx_gemm as peer
    out = "bf16"            # the peer's output

    def shapes():
        return [(c["a_fmt"], c["b_fmt"], c["M"], c["N"], c["K"], s) for s in (1, 0) for c in peer.cells()]

    def label(kernel, cfg):
        return ",".join(f"{k}={v}" for k, v in cfg.items())

    @functools.lru_cache(maxsize=1)   # one shape's candidates, product and peer share its operands
    def inputs(shape):
        a_fmt, b_fmt, M, N, K, shuffled = shape
        a, sa, b, sb = peer.operands(a_fmt, b_fmt, M, N, K)
        return (a, sa, b, sb, *((quant.shuffle_scales(sa), quant.shuffle_scales(sb)) if shuffled else (sa, sb)))

    def call(shape, cfg):
        import mxgemm
        a_fmt, b_fmt, M, N, _, shuffled = shape
        a, _, b, _, xa, xb = inputs(shape)
        c = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        return lambda: mxgemm.mx_gemm(a, xa, b, xb, a_format=a_fmt, b_format=b_fmt, out=c, config=cfg,
                                      shuffled_scales=bool(shuffled))

    def run(shape, kernel, cfg):
        _, us, _, t = peer.time_ours(call(shape, cfg), rounds=peer.ROUNDS)
        return us, t["limiter"]

    def product(shape, kernel, cfg):
        """(the config's output, the reference's, the rows checked): the whole output up to
        2048^3; above, the first and the last row of tiles, their workgroups alone (the whole
        8192^3 grid ran over 25 minutes on the emulator without finishing)."""
        from .. import launcher
        a_fmt, b_fmt, M, N, K = shape[:5]
        a, sa, b, sb = inputs(shape)[:4]
        tiles_m, tiles_n = -(-M // cfg["BM"]), -(-N // cfg["BN"])
        ends = sorted({0, tiles_m - 1}) if M * N * K > 2 ** 33 else range(tiles_m)
        with launcher.emulator_settings(race_check=False, workgroups=[(x, y, 0) for y in ends for x in range(tiles_n)]):
            got = call(shape, cfg)()
        rows = torch.cat([torch.arange(y * cfg["BM"], min(M, (y + 1) * cfg["BM"])) for y in ends])
        return got, reference.mx_gemm_ref(a[rows], sa[rows], b, sb, a_fmt, b_fmt, chunk=reference.MX_MMA_K), rows

    def run_peer(shape):
        a_fmt, b_fmt = shape[:2]
        a, sa, b, sb = inputs(shape)[:4]
        theirs, t = peer.time_peer(a, sa, b, sb, a_fmt, b_fmt)
        return t["us"], theirs

    def fields(shape) -> dict:
        a_fmt, b_fmt, M, N, K, shuffled = shape
        return dict(arch=op.ARCH, M=M, a_format=a_fmt, b_format=b_fmt, out=out, shuffled=shuffled, N=N, K=K)

    def heuristic(shape):
        a_fmt, b_fmt, M, N, K, shuffled = shape
        return None, op.heuristic_pick(op.ARCH, a_fmt, b_fmt, out, M, N, K, shuffled)

    def row(shape, best, runner, peer_us):
        us, _, cfg = best
        return {**fields(shape), **cfg, **_timed(us, runner, peer_us, label)}

    def table(rows):
        return _markdown(["a", "b", "scales", "M", "N", "K"], lambda r: (
            [r["a_format"], r["b_format"], "shuffled" if r["shuffled"] == "1" else "row-major", r["M"], r["N"], r["K"]],
            f"{r['BM']} x {r['BN']}" + (f", {r['SPLITS']} K splits" if r["SPLITS"] != "1" else "")), rows)

    def key(r):
        return (r["arch"], r["a_format"], r["b_format"], r["out"], *(int(r[c]) for c in ("shuffled", "M", "N", "K")))

    return dict(csv=op.CONFIG_CSV, table=table, fields=op.CSV_FIELDS, key=key,
                shape_key=lambda s: key(fields(s)), shapes=shapes,
                candidates=lambda s: [(None, c) for c in op.candidates(op.ARCH, s[0], s[1], out, s[5])],
                run=run, product=product, run_peer=run_peer, heuristic=heuristic, row=row, label=label)


def _blockscale():
    from .. import launcher, reference
    from ..ops import blockscale_grouped_gemm as op
    from .peers import blockscale as peer
    family = dict(MASKED=0, UE8M0=0, OUT="bf16")     # the peer's: fp32 block scales, bf16 out

    def shapes():
        return [(int(c["masked"]), c["G"], c["m"], c["N"], c["K"]) for c in peer.cells()]

    def label(kernel, tile):
        return f"BM={tile[0]},BN={tile[1]}"

    @functools.lru_cache(maxsize=2)     # a shape's two sampled K
    def inputs(shape, K):
        masked, G, m, N, _ = shape
        return peer.operands(G, m, N, K, bool(masked))

    def extrapolated(shape, time_at):
        """time_at(K) -> (us, timing) at the two K of peer.K_SAMPLE, extrapolated linearly to the
        shape's K (peer.run's method); the timing of the larger K."""
        (us0, _), (us1, t) = (time_at(K) for K in peer.K_SAMPLE)
        return us0 + (shape[4] - peer.K_SAMPLE[0]) / (peer.K_SAMPLE[1] - peer.K_SAMPLE[0]) * (us1 - us0), t

    def config(tile):
        return {"BM": tile[0], "BN": tile[1]}

    def run(shape, kernel, tile):
        def at(K):
            _, us, _, t = peer.time_ours(lambda: peer.ours(*inputs(shape, K), bool(shape[0]), config(tile)),
                                         rounds=peer.ROUNDS)
            return us, t
        us, t = extrapolated(shape, at)
        return us, t["limiter"]

    def product(shape, kernel, tile):
        """The tile's whole output at the larger sampled K, and the reference's."""
        a, sfa, b, sfb, layout = inputs(shape, peer.K_SAMPLE[1])
        with launcher.emulator_settings(race_check=False):
            got = peer.ours(a, sfa, b, sfb, layout, bool(shape[0]), config(tile))
        if shape[0]:
            return got, reference.m_grouped_fp8_gemm_nt_masked_ref(a, sfa, b, sfb, layout)
        return got, reference.m_grouped_fp8_gemm_nt_contiguous_ref(a, sfa, b, sfb, layout)

    def run_peer(shape):
        outs = {}

        def at(K):
            outs[K], t = peer.time_peer(*inputs(shape, K), bool(shape[0]))
            return t["us"], t
        us, _ = extrapolated(shape, at)
        theirs = outs[peer.K_SAMPLE[1]]
        return us, theirs.masked_fill(theirs == 0, float("nan"))    # zeros: rows the peer did not store

    def rows(shape):
        """The op's M of the shape (masked: a group buffer's rows; contiguous: a's rows, padded)."""
        masked, G, m = shape[:3]
        return m if masked else G * -(-m // op.M_ALIGN) * op.M_ALIGN

    def fields(shape) -> dict:
        masked, G, _, N, K = shape
        return dict(family=op.family_text({**family, "MASKED": masked}), G=G, M=rows(shape), N=N, K=K)

    def heuristic(shape):
        masked, G, _, N, _ = shape
        tiles = op.family_tiles({**family, "MASKED": masked})
        return None, op.choose_tile(N, op.row_tiles(masked, G, rows(shape)), tiles)[:2]

    def row(shape, best, runner, peer_us):
        us, _, tile = best
        return {**fields(shape), **config(tile), **_timed(us, runner, peer_us, label)}

    def table(rows_):
        return _markdown(["layout", "G", "M", "N", "K"], lambda r: (
            ["masked" if "MASKED=1" in r["family"] else "contiguous", r["G"], r["M"], r["N"], r["K"]],
            f"{r['BM']} x {r['BN']}"), rows_)

    def key(r):
        return (r["family"], *(int(r[c]) for c in "GMNK"))

    return dict(csv=op.CONFIG_CSV, table=table, fields=op.CSV_FIELDS, key=key,
                shape_key=lambda s: key(fields(s)), shapes=shapes,
                candidates=lambda s: [(None, t) for t in op.candidates(s[3], {**family, "MASKED": s[0]})],
                run=run, product=product, run_peer=run_peer, heuristic=heuristic, row=row, label=label)


FAMILIES = {"smallm": _smallm, "moe_mxfp8": _moe_mxfp8, "grouped_fp8": _grouped_fp8, "mx_gemm": _mx_gemm,
            "blockscale": _blockscale}


def tune(family: str, shapes=None, out_csv=None, retune=False, out=print) -> list:
    """Tune ``shapes`` (default: the family's) -> the rows written, one per shape."""
    from .. import tuned
    f = FAMILIES[family]()
    path = out_csv or f["csv"]
    kept = {f["key"](r): r for r in tuned.read_rows(path)}
    rows, agree = [], 0
    for n, shape in enumerate(shapes or f["shapes"](), 1):
        done = kept.get(f["shape_key"](shape))
        if done and done["source"] == "simulated" and not retune:
            continue
        t0 = time.time()
        timed = []
        for kernel, variant in f["candidates"](shape):
            us, limiter = f["run"](shape, kernel, variant)
            timed.append((us, kernel, variant))
            out(f"    {f['label'](kernel, variant):44s} {us:9.2f} us  {limiter}")
        if not timed:
            out(f"{shape}: no candidate serves it")
            continue
        timed.sort(key=lambda t: t[0])
        best = timed[0]
        mine, ref, checked = (*f["product"](shape, *best[1:]), slice(None))[:3]
        mine = mine[checked]
        torch.testing.assert_close(mine.float(), ref.float(), rtol=2 ** -7, atol=1e-2)
        try:
            peer_us, theirs = f["run_peer"](shape)
        except NoPeer as e:
            peer_us = None
            out(f"    no peer at this shape: {e}")
        else:
            theirs = theirs[checked]
            wrote = ~theirs.isnan()
            assert wrote.any(), f"{shape}: the peer's simulated workgroups wrote nothing the product check holds"
            torch.testing.assert_close(theirs[wrote].float(), mine[wrote].float(), rtol=2 ** -7, atol=1e-2)
        h_us = next(us for us, k, v in timed if (k, v) == f["heuristic"](shape))
        agree += h_us <= best[0] * (1 + WITHIN)
        r = f["row"](shape, best, timed[1] if len(timed) > 1 else None, peer_us)
        rows.append(r)
        tuned.put_row(r, path, f["fields"], f["key"])
        versus = "no peer" if peer_us is None else \
            f"peer {peer_us:.2f} us (x{peer_us / best[0]:.2f}{'' if peer_us > best[0] else ', PEER FASTER'})"
        out(f"[{n}] {'x'.join(map(str, shape))}: {f['label'](*best[1:])} {best[0]:.2f} us; {versus}; heuristic "
            f"{h_us:.2f} us (x{h_us / best[0]:.3f}); {time.time() - t0:.0f} s")
    if rows:
        out(f"heuristic within {100 * WITHIN:.0f} % of the best: {agree} of {len(rows)} shapes; "
            f"ours faster than the peer: {sum(float(r['peer_us']) > float(r['us']) for r in rows if r['peer_us'])} "
            f"of {sum(bool(r['peer_us']) for r in rows)} with a peer")
    return rows


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m mxgemm tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=sorted(FAMILIES))
    p.add_argument("--shapes", nargs="*", help="shapes as x-separated integers, the family's form (default: "
                                               "the family's shapes)")
    p.add_argument("--out", help="CSV to write (default: the shipped table of the family)")
    p.add_argument("--retune", action="store_true", help="also shapes whose row is already simulated")
    p.add_argument("--table", action="store_true", help="print the table's simulated rows as markdown")
    args = p.parse_args(argv)
    if args.table:
        from .. import tuned
        f = FAMILIES[args.family]()
        print(f["table"](tuned.read_rows(args.out or f["csv"])))
        return 0
    shapes = [tuple(int(p) if p.isdigit() else p for p in s.split("x")) for s in args.shapes] if args.shapes else None
    rows = tune(args.family, shapes, args.out, args.retune, out=lambda s: print(s, flush=True, file=sys.stdout))
    return 0 if rows else 1
