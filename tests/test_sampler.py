"""Sampler: logit processors, truncation, greedy, seeded draws, distribution, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from mtpserve.engine.sampler import Sampler, SamplingRow, make_generator
from mtpserve.sampling_params import SamplingParams

NEG_INF = float("-inf")
# Upper 0.1% points of the chi-square distribution (standard tables), by degrees of freedom.
CHI2_CRIT_0_001 = {2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def row(prompt=(), output=(), eos=(), gen=None, **kw) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), gen, list(prompt), list(output), list(eos))


def t(*vals) -> torch.Tensor:
    return torch.tensor([list(vals)], dtype=torch.float32)


def support(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0] > 0).flatten().tolist()


# ---- logit processors ------------------------------------------------------------------------

def test_logit_bias_added_and_clamped_to_100():
    s = Sampler(4)
    out = s.process_logits(t(1.0, 2.0, 3.0, 4.0), [row(logit_bias={0: 5.0, 2: -250.0, 3: 150.0})])
    assert out.tolist() == [[6.0, 2.0, -97.0, 104.0]]


def test_process_logits_leaves_input_and_plain_rows_alone():
    s = Sampler(3)
    raw = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    out = s.process_logits(raw, [row(), row(logit_bias={1: 1.0})])
    assert raw.tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    assert out.tolist() == [[1.0, 2.0, 3.0], [1.0, 3.0, 3.0]]


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_bans_eos_and_stop_token_ids_until_reached(device):
    s = Sampler(5)
    logits = torch.zeros(4, 5, device=device)
    rows = [row(output=[4, 4], eos=[3], min_tokens=3, stop_token_ids=[1]),
            row(output=[4, 4, 4], eos=[3], min_tokens=3, stop_token_ids=[1]),
            row(output=[], eos=[3], min_tokens=1, stop_token_ids=[1], ignore_eos=True),
            row(output=[], eos=[3, 0], min_tokens=2)]
    out = s.process_logits(logits, rows)
    assert out.tolist() == [[0.0, NEG_INF, 0.0, NEG_INF, 0.0],
                            [0.0, 0.0, 0.0, 0.0, 0.0],
                            [0.0, NEG_INF, 0.0, 0.0, 0.0],
                            [NEG_INF, 0.0, 0.0, NEG_INF, 0.0]]


def test_min_tokens_ban_makes_greedy_skip_eos():
    s = Sampler(3)
    logits = t(1.0, 0.0, 5.0)
    assert s.sample(logits, [row(eos=[2], min_tokens=1, temperature=0)]).token_ids.tolist() == [0]
    assert s.sample(logits, [row(eos=[2], temperature=0)]).token_ids.tolist() == [2]


def test_repetition_penalty_divides_positive_multiplies_negative_over_prompt_and_output():
    s = Sampler(5)
    out = s.process_logits(t(2.0, -2.0, 1.0, -1.0, 0.5),
                           [row(prompt=[0], output=[1, 1, 3], repetition_penalty=2.0)])
    # tokens 0 (prompt), 1 and 3 (output; repeats count once): 2/2, -2*2, -1*2; 2 and 4 untouched
    assert out.tolist() == [[1.0, -4.0, 1.0, -2.0, 0.5]]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    s = Sampler(5)
    out = s.process_logits(torch.zeros(1, 5),
                           [row(prompt=[3, 4], output=[1, 1, 2],
                                presence_penalty=0.5, frequency_penalty=0.25)])
    # token 1: 0.5 + 2 * 0.25; token 2: 0.5 + 1 * 0.25; prompt tokens 3, 4 untouched
    assert out.tolist() == [[0.0, -1.0, -0.75, 0.0, 0.0]]


def test_negative_presence_penalty_rewards_seen_tokens():
    s = Sampler(3)
    out = s.process_logits(torch.zeros(1, 3), [row(output=[2], presence_penalty=-1.5)])
    assert out.tolist() == [[0.0, 0.0, 1.5]]


def test_bias_is_applied_before_repetition_penalty():
    s = Sampler(2)
    out = s.process_logits(t(1.0, 1.0), [row(output=[0], logit_bias={0: 3.0},
                                              repetition_penalty=2.0)])
    assert out.tolist() == [[2.0, 1.0]]  # (1 + 3) / 2; the other order would give 3.5


def test_penalties_batch_rows_with_different_histories():
    s = Sampler(3)
    rows = [row(output=[0], frequency_penalty=1.0), row(),
            row(output=[2, 2], frequency_penalty=1.0)]
    out = s.process_logits(torch.ones(3, 3), rows)
    assert out.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, -1.0]]


def test_out_of_vocab_ids_and_bad_shapes_raise():
    s = Sampler(4)
    with pytest.raises(IndexError, match="token id 7 is outside the vocabulary"):
        s.process_logits(torch.zeros(1, 4), [row(logit_bias={7: 1.0})])
    with pytest.raises(ValueError, match=r"expected a \[1, 4\] tensor, got \[1, 5\]"):
        s.process_logits(torch.zeros(1, 5), [row()])
    with pytest.raises(ValueError, match=r"expected a \[2, 4\] tensor"):
        s.probs(torch.zeros(1, 4), [row(), row()])


# ---- temperature and truncation --------------------------------------------------------------

def test_temperature_scales_logits():
    s = Sampler(2)
    p = s.probs(t(0.0, math.log(2.0)), [row(temperature=0.5)])
    torch.testing.assert_close(p, torch.tensor([[0.2, 0.8]]))  # [1, 2] ** 2, normalized


def test_top_k_keeps_k_largest_and_ties_at_the_kth_value():
    s = Sampler(5)
    logits = t(1.0, 5.0, 3.0, 5.0, 2.0)
    assert support(s.probs(logits, [row(top_k=2)])) == [1, 3]
    assert support(s.probs(logits, [row(top_k=3)])) == [1, 2, 3]
    assert support(s.probs(logits, [row(top_k=1)])) == [1, 3]  # tie at the 1st value
    assert support(s.probs(logits, [row(top_k=-1)])) == [0, 1, 2, 3, 4]
    torch.testing.assert_close(s.probs(logits, [row(top_k=2)]),
                               torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]))


def test_top_p_keeps_smallest_prefix_reaching_p():
    s = Sampler(4)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert support(s.probs(logits, [row(top_p=0.4)])) == [0]
    assert support(s.probs(logits, [row(top_p=0.75)])) == [0, 1]
    assert support(s.probs(logits, [row(top_p=0.85)])) == [0, 1, 2]
    assert support(s.probs(logits, [row(top_p=0.96)])) == [0, 1, 2, 3]
    torch.testing.assert_close(s.probs(logits, [row(top_p=0.75)]),
                               torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_top_p_stops_as_soon_as_the_mass_reaches_p_exactly():
    s = Sampler(4)
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()  # exact in float32
    assert support(s.probs(logits, [row(top_p=0.5)])) == [0]
    assert support(s.probs(logits, [row(top_p=0.75)])) == [0, 1]
    assert support(s.probs(logits, [row(top_p=0.8)])) == [0, 1, 2, 3]  # tie at 0.125 kept


def test_min_p_keeps_tokens_above_fraction_of_max():
    s = Sampler(4)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert support(s.probs(logits, [row(min_p=0.35)])) == [0, 1]        # >= 0.175
    assert support(s.probs(logits, [row(min_p=0.25)])) == [0, 1, 2]     # >= 0.125
    torch.testing.assert_close(s.probs(logits, [row(min_p=0.25)]),
                               torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)


def test_top_p_applies_to_what_top_k_left():
    s = Sampler(4)
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # alone: mass before token 2 is 0.7 < 0.72; after top_k=3 it is 7/9 > 0.72
    assert support(s.probs(logits, [row(top_p=0.72)])) == [0, 1, 2]
    assert support(s.probs(logits, [row(top_k=3, top_p=0.72)])) == [0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_truncation_is_per_row_in_a_mixed_batch(device):
    s = Sampler(4)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(4, 1).to(device)
    rows = [row(), row(top_k=1), row(top_p=0.75), row(min_p=0.25)]
    keep = (s.probs(logits, rows) > 0).tolist()
    assert keep == [[True, True, True, True], [True, False, False, False],
                    [True, True, False, False], [True, True, True, False]]


# ---- greedy ----------------------------------------------------------------------------------

def test_greedy_is_argmax_with_lowest_id_on_ties_and_one_hot_probs():
    s = Sampler(4)
    logits = t(1.0, 3.0, 3.0, 0.0)
    rows = [row(temperature=0.0)]
    assert s.probs(logits, rows).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert s.sample(logits, rows).token_ids.tolist() == [1]


def test_greedy_sees_penalties_and_ignores_truncation_settings():
    s = Sampler(2)
    rows = [row(output=[0], repetition_penalty=2.0, temperature=0.0, top_k=1, min_p=0.9)]
    assert s.sample(t(3.0, 2.9), rows).token_ids.tolist() == [1]  # 3 / 2 < 2.9


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_rows_consume_no_randomness(device):
    dev = torch.empty(0, device=device).device
    s = Sampler(8, seed=3)
    gen = make_generator(11, dev)
    before_own, before_shared = gen.get_state(), s.default_generator(dev).get_state()
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(0)).to(dev)
    s.sample(logits, [row(temperature=0.0, gen=gen), row(temperature=0.0)])
    assert torch.equal(gen.get_state(), before_own)
    assert torch.equal(s.default_generator(dev).get_state(), before_shared)


# ---- randomness ------------------------------------------------------------------------------

def _draws(seed: int, n: int, vocab: int = 50) -> list[int]:
    s = Sampler(vocab, seed=123)
    gen = make_generator(seed, "cpu")
    logits = torch.zeros(1, vocab)
    return [s.sample(logits, [row(gen=gen)]).token_ids.item() for _ in range(n)]


def test_same_seed_same_sequence_different_seed_different_sequence():
    assert _draws(7, 30) == _draws(7, 30)
    assert _draws(7, 30) != _draws(8, 30)


def test_sampler_seed_drives_unseeded_rows():
    def run(seed):
        s = Sampler(50, seed=seed)
        return [s.sample(torch.zeros(1, 50), [row()]).token_ids.item() for _ in range(30)]
    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_row_does_not_depend_on_batch_neighbours(device):
    vocab = 40
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(5)).to(device)

    def seeded_tokens(extra_before: int, extra_after: int) -> list[int]:
        s = Sampler(vocab, seed=99)
        gen, other = make_generator(42, logits.device), make_generator(1, logits.device)
        toks = []
        for _ in range(10):
            rows = ([row()] * extra_before + [row(gen=gen, top_k=20)]
                    + [row(gen=other)] * extra_after)
            batch = logits.repeat(len(rows), 1)
            toks.append(s.sample(batch, rows).token_ids[extra_before].item())
        return toks

    alone = seeded_tokens(0, 0)
    assert seeded_tokens(3, 0) == alone
    assert seeded_tokens(2, 2) == alone


def test_draw_is_a_function_of_generator_state_and_probs():
    s = Sampler(30)
    probs = torch.softmax(torch.randn(1, 30, generator=torch.Generator().manual_seed(2)), dim=1)
    g1, g2 = make_generator(5, "cpu"), make_generator(5, "cpu")
    a = [s.draw(probs, [row(gen=g1)]).item() for _ in range(20)]
    b = [s.draw(probs, [row(gen=g2)]).item() for _ in range(20)]
    assert a == b


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    inside = expected > 0
    assert counts[~inside].sum().item() == 0  # nothing drawn outside the support
    stat = ((counts[inside] - expected[inside]) ** 2 / expected[inside]).sum().item()
    return stat, int(inside.sum().item()) - 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(temperature=0.8, top_k=5),
                                dict(temperature=1.3, top_p=0.9),
                                dict(temperature=1.0, min_p=0.1, presence_penalty=1.0)])
def test_draw_matches_probs_chi_square(kw, device):
    vocab, n = 6, 20000
    s = Sampler(vocab, seed=2024)
    logits = torch.tensor([[0.0, 0.5, 1.0, 1.5, -1.0, 2.0]], device=device)
    base = row(output=[5], **kw)
    p = s.probs(s.process_logits(logits, [base]), [base])[0]
    # one seeded generator shared by n rows (drawn in row order), and the shared generator
    seeded = [row(output=[5], gen=make_generator(77, logits.device), **kw)]
    seeded_rows = seeded * n
    for rows in (seeded_rows, [base] * n):
        toks = s.sample(logits.repeat(n, 1), rows).token_ids
        stat, dof = _chi_square(toks.cpu(), p.cpu())
        assert stat < CHI2_CRIT_0_001[dof], (stat, dof, p.tolist())


# ---- logprobs --------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_are_log_softmax_of_raw_logits_with_ordered_top_lists(device):
    vocab = 50
    s = Sampler(vocab)
    raw = (torch.randn(3, vocab, generator=torch.Generator().manual_seed(9)) * 3).to(device)
    rows = [row(logprobs=5, logit_bias={0: 100.0}, temperature=0.0),
            row(), row(logprobs=0, temperature=0.7, repetition_penalty=1.5, output=[1, 2])]
    out = s.sample(raw, rows)
    ref = torch.log_softmax(raw, dim=1).cpu()
    lp0, lp1, lp2 = out.logprobs
    assert out.token_ids[0].item() == 0  # the bias decides the token ...
    assert lp0.token_id == 0 and lp0.logprob == ref[0, 0].item()  # ... not the logprob
    top_vals, top_ids = ref[0].topk(5)
    assert lp0.top == list(zip(top_ids.tolist(), top_vals.tolist()))
    assert [v for _, v in lp0.top] == sorted((v for _, v in lp0.top), reverse=True)
    assert lp1 is None
    tok2 = out.token_ids[2].item()
    assert lp2.token_id == tok2 and lp2.logprob == ref[2, tok2].item() and lp2.top == []


def test_logprobs_none_when_no_row_asks_and_ties_list_lower_id_first():
    s = Sampler(4)
    assert s.sample(torch.zeros(2, 4), [row(), row()]).logprobs is None
    lps = s.logprobs(t(1.0, 2.0, 2.0, 2.0), torch.tensor([3]), [row(logprobs=3)])
    lp = torch.log_softmax(t(1.0, 2.0, 2.0, 2.0), dim=1)[0]
    assert lps[0].top == [(1, lp[1].item()), (2, lp[2].item()), (3, lp[3].item())]
    assert lps[0].logprob == lp[3].item()


# ---- CUDA ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_processing_and_seeded_draws_repeat():
    vocab = 1000
    raw = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3)) * 2
    rows = [row(output=[1, 2, 2], prompt=[5], repetition_penalty=1.3, frequency_penalty=0.5,
                logit_bias={7: 4.0}, temperature=0.0),
            row(top_k=50, top_p=0.9, min_p=0.05, temperature=0.9),
            row(min_tokens=4, eos=[0], stop_token_ids=[9]),
            row(logprobs=3)]
    s = Sampler(vocab)
    cpu_p = s.probs(s.process_logits(raw, rows), rows)
    cuda_p = s.probs(s.process_logits(raw.cuda(), rows), rows).cpu()
    torch.testing.assert_close(cuda_p, cpu_p, rtol=1e-5, atol=1e-6)
    dev = torch.device("cuda", torch.cuda.current_device())

    def seq():
        gen = make_generator(17, dev)
        r = [row(gen=gen, top_k=50)]
        return [s.sample(raw[1:2].cuda(), r).token_ids.item() for _ in range(20)]
    assert seq() == seq()
