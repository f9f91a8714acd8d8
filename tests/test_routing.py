"""routing.moe_sorting spec: aiter's block-aligned expert-sorted layout."""
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxgemm.guards import GuardError
from mxgemm.metrics import assert_bitwise_equal
from mxgemm.routing import decode_sorted_id, moe_sorting


def loop_sorting(topk_ids, topk_weights, E, block_m, pad, mask=None):
    """Plain per-expert loop, written from the layout's definition."""
    T, topk = topk_ids.shape
    size = T * topk + E * block_m - topk
    ids, w, exps = [pad] * size, [0.0] * size, [-1] * (-(-size // block_m))
    row = blk = local = 0
    for e in range(E):
        if mask is not None and not mask[e]:
            continue
        pairs = [(t, s) for t in range(T) for s in range(topk) if topk_ids[t, s] == e]
        for i, (t, s) in enumerate(pairs):
            ids[row + i], w[row + i] = (s << 24) | t, float(topk_weights[t, s])
        nblk = -(-len(pairs) // block_m)
        exps[blk:blk + nblk] = [local] * nblk
        row, blk, local = row + nblk * block_m, blk + nblk, local + 1
    return (torch.tensor(ids, dtype=torch.int32), torch.tensor(w, dtype=torch.float32),
            torch.tensor(exps, dtype=torch.int32), row)


def routing_case(T, E, topk, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(T)]).int()
    return ids, torch.rand(T, topk, generator=g)


@pytest.mark.parametrize("T,E,topk,block_m", [(1, 4, 2, 32), (7, 5, 3, 4), (64, 16, 4, 16), (33, 8, 8, 32)])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_loop_definition(T, E, topk, block_m, masked):
    ids, w = routing_case(T, E, topk, seed=T)
    mask = (torch.arange(E) % 3 != 1).int() if masked else None
    out = moe_sorting(ids, w, E, block_m, expert_mask=mask)
    want_ids, want_w, want_exp, n = loop_sorting(ids, w, E, block_m, (topk << 24) | T, mask)
    assert out.num_valid_ids.tolist() == [n]
    assert_bitwise_equal(out.sorted_token_ids, want_ids, "sorted_token_ids")
    assert_bitwise_equal(out.sorted_weights, want_w, "sorted_weights")
    assert_bitwise_equal(out.sorted_expert_ids, want_exp, "sorted_expert_ids")


def test_pad_value_and_num_valid_len():
    ids, w = routing_case(5, 4, 2, seed=1)
    out = moe_sorting(ids, w, 4, 8, pad_value=-7, num_valid_len=2)
    n = int(out.num_valid_ids[0])
    assert out.num_valid_ids.tolist() == [n, 5]
    padding = out.sorted_token_ids == -7
    assert int((~padding).sum()) == 10 and (out.sorted_weights[padding] == 0).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.data(), st.sampled_from([1, 4, 16, 32]))
def test_layout_invariants(T, E, data, block_m):
    topk = data.draw(st.integers(1, E))
    ids, w = routing_case(T, E, topk, seed=data.draw(st.integers(0, 2**31 - 1)))
    out = moe_sorting(ids, w, E, block_m)
    n = int(out.num_valid_ids[0])
    tok, slot = decode_sorted_id(out.sorted_token_ids.long())
    real = tok < T
    assert n % block_m == 0 and not real[n:].any()  # nothing valid past num_valid
    # every (token, slot) pair appears exactly once
    pairs = sorted(zip(tok[real].tolist(), slot[real].tolist()))
    assert pairs == [(t, s) for t in range(T) for s in range(topk)]
    # each row's block belongs to that row's expert; weights travel with their pair
    blk_exp = out.sorted_expert_ids.long()[torch.arange(len(tok)) // block_m]
    assert (blk_exp[real] == ids.long()[tok[real], slot[real]]).all()
    assert torch.equal(out.sorted_weights[real], w[tok[real], slot[real]])
    assert (out.sorted_weights[~real] == 0).all() and (out.sorted_token_ids[~real] == (topk << 24) | T).all()
    # experts in increasing order, no empty blocks, -1 after the last block
    nb = n // block_m
    used = out.sorted_expert_ids[:nb]
    assert (used[1:] >= used[:-1]).all() and (out.sorted_expert_ids[nb:] == -1).all()
    assert real[:n].view(nb, block_m).any(1).all()
    # within an expert the pairs keep row-major (token, slot) order
    key = (tok * topk + slot)[real]
    same = blk_exp[real][1:] == blk_exp[real][:-1]
    assert (key[1:][same] > key[:-1][same]).all()


def sorting_args(**override):
    """A valid moe_sorting call (T=2, topk=2, E=4) with some arguments replaced."""
    args = dict(topk_ids=torch.tensor([[0, 1], [2, 3]]), topk_weights=torch.rand(2, 2), num_experts=4)
    return {**args, **override}


BAD_SORTING = {  # case: (arguments, message naming the rule, the argument and its value)
    "weights-shape": (dict(topk_ids=torch.tensor([[1, 2]]), topk_weights=torch.rand(3, 5)),
                      "[shape] topk_weights has shape [3, 5]; expected [1, 2]"),
    "weights-int": (dict(topk_weights=torch.ones(2, 2, dtype=torch.int64)),
                    "[dtype] topk_weights has dtype torch.int64; expected a floating dtype"),
    "weights-device": (dict(topk_weights=torch.rand(2, 2, device="meta")),
                       "[device] all tensors must be on one device; got topk_ids=cpu, topk_weights=meta"),
    "float-ids": (dict(topk_ids=torch.tensor([[1.7, 2.2]]), topk_weights=torch.rand(1, 2)),
                  "[dtype] topk_ids has dtype torch.float32; expected an integer dtype"),
    "list-ids": (dict(topk_ids=[[0, 1], [2, 3]]), "[type] topk_ids must be a torch.Tensor; got list"),
    "1d-ids": (dict(topk_ids=torch.tensor([1, 2]), topk_weights=torch.rand(2)),
               "[shape] topk_ids must be 2-D [T, topk]; got shape [2]"),
    "topk-129": (dict(topk_ids=torch.zeros(1, 129, dtype=torch.int64), topk_weights=torch.rand(1, 129),
                      num_experts=200, pad_value=0),
                 "[shape] topk_ids has shape [1, 129]: a sorted id packs (slot << 24) | token into int32"),
    "topk-128-default-pad": (dict(topk_ids=torch.zeros(1, 128, dtype=torch.int64), topk_weights=torch.rand(1, 128),
                                  num_experts=200),
                             "[shape] topk_ids has shape [1, 128]: a sorted id packs (slot << 24) | token into int32"),
    "topk-over-experts": (dict(topk_ids=torch.tensor([[0, 0]]), num_experts=1, block_m=1, topk_weights=torch.rand(1, 2)),
                          "[topk] topk = 2 (topk_ids shape [1, 2]) > num_experts = 1"),
    "id-negative": (dict(topk_ids=torch.tensor([[0, 1], [-1, 3]])),
                    "[expert-id] topk_ids[1, 0] = -1; expected an expert id 0 <= id < num_experts = 4"),
    "id-too-big": (dict(topk_ids=torch.tensor([[0, 1], [2, 4]])),
                   "[expert-id] topk_ids[1, 1] = 4; expected an expert id 0 <= id < num_experts = 4"),
    "num_experts-0": (dict(num_experts=0), "[num_experts] num_experts = 0 must be a positive int"),
    "block_m-0": (dict(block_m=0), "[block_m] block_m = 0 must be a positive int"),
    "mask-length": (dict(expert_mask=torch.ones(3)), "[shape] expert_mask has shape [3]; expected [4]"),
    "num_valid_len-3": (dict(num_valid_len=3), "[num_valid_len] num_valid_len = 3; expected 1"),
    "pad_value-int32": (dict(pad_value=2**31), "[pad_value] pad_value = 2147483648 must be an int32"),
}


@pytest.mark.parametrize("case", BAD_SORTING)
def test_rejects_bad_arguments(case):
    override, message = BAD_SORTING[case]
    with pytest.raises(GuardError, match=re.escape(message)):
        moe_sorting(**sorting_args(**override))


def test_skipping_routes_through_a_masked_extra_expert():
    """The docstring's recipe for aiter's skip of out-of-range ids: route them to expert E, masked out."""
    ids, w, E, block_m = torch.tensor([[0, -1], [2, 1], [-1, 3], [1, 2]]), torch.rand(4, 2), 4, 4
    out = moe_sorting(torch.where(ids < 0, E, ids), w, E + 1, block_m, expert_mask=torch.tensor([1] * E + [0]))
    want_ids, want_w, want_exp, n = loop_sorting(ids, w, E, block_m, (2 << 24) | 4)  # -1 matches no expert
    assert out.num_valid_ids.tolist() == [n]
    assert_bitwise_equal(out.sorted_token_ids[:len(want_ids)], want_ids, "sorted_token_ids")
    assert_bitwise_equal(out.sorted_weights[:len(want_w)], want_w, "sorted_weights")
    assert_bitwise_equal(out.sorted_expert_ids[:len(want_exp)], want_exp, "sorted_expert_ids")
