"""The scheduler: continuous batching of every SUT, token-identical to decoding one prompt at a time."""
import pytest

from suts.baseline import Baseline
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Scheduler, Sequence
from suts.registry import make_sut
from suts.speculative import Speculative

PROMPTS = [[1, 2, 3], [5] * 9, list(range(20)), [7, 30, 2, 2, 9, 11], [4], list(range(31, 0, -2)), [8, 8, 1]]
LENGTHS = [1, 4, 5, 9, 33, 17, 40]  # 1, gamma, gamma + 1, odd: rows finish, and others join, mid-run


def serve(sut, prompts, lengths, max_batch, params=SamplingParams(), token_budget=None):
    """Tokens of every prompt decoded through one scheduler, and the batch size of every step it ran."""
    sizes, step = [], sut.step
    sut.step = lambda seqs: sizes.append(len(seqs)) or step(seqs)
    seqs = [Sequence(p, n, params.for_sample(i)) for i, (p, n) in enumerate(zip(prompts, lengths))]
    scheduler = Scheduler(sut, max_batch, token_budget)
    scheduler.run(seqs)
    assert not scheduler.busy  # every row was freed
    return [s.tokens for s in seqs], sizes


@pytest.fixture(scope="module")
def expected(pair):
    target, _ = pair
    return [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("max_batch", [2, 4])
def test_batched_spec_emits_the_unbatched_baseline_tokens(pair, expected, gamma, max_batch):
    target, draft = pair
    tokens, sizes = serve(Speculative(target, draft, gamma=gamma), PROMPTS, LENGTHS, max_batch)
    assert tokens == expected
    # full batches (a row whose sequence ends at its first token stays free until the next admission), then the tail
    assert max(sizes) >= max(2, max_batch - 1) and min(sizes) < max(sizes)


@pytest.mark.parametrize("name", ["baseline", "spec-int8"])
def test_batched_baseline_and_int8_draft_emit_the_unbatched_baseline_tokens(pair, expected, name):
    target, draft = pair
    assert serve(make_sut(name, target, draft), PROMPTS, LENGTHS, 3)[0] == expected


def test_rows_stop_at_eos_in_a_batch(pair):
    target, draft = pair
    reference = Baseline(target).generate(PROMPTS[0], 40).tokens
    eos = reference[10]
    expected = [Baseline(target, eos_id=eos).generate(p, 30).tokens for p in PROMPTS]
    assert any(len(t) < 30 for t in expected) and any(len(t) == 30 for t in expected)
    for sut in (Baseline(target, eos_id=eos), Speculative(target, draft, eos_id=eos, gamma=4)):
        assert serve(sut, PROMPTS, [30] * len(PROMPTS), 4)[0] == expected


def test_min_tokens_and_ignore_eos_decode_through_eos_as_the_eos_free_decode_does(pair):
    """A sequence whose EOS may end it only from min_tokens on emits, up to there, the tokens of a decode without
    EOS, and then stops at the next EOS; with min_tokens = max_new_tokens (a client's ignore_eos) it emits exactly
    max_new_tokens, EOS tokens among them, batched beside rows that stop at EOS."""
    target, draft = pair
    free = Baseline(target).generate(PROMPTS[0], 40).tokens
    eos = free[10]
    first = free.index(eos)
    for sut in (Baseline(target, eos_id=eos), Speculative(target, draft, eos_id=eos, gamma=4)):
        seqs = [Sequence(PROMPTS[0], 40, SamplingParams(), min_tokens=n) for n in (0, first + 2, 40)]
        seqs.append(Sequence(PROMPTS[2], 40, SamplingParams()))
        Scheduler(sut, 4).run(seqs)
        stopped, later, through, other = (s.tokens for s in seqs)
        assert stopped == free[:first + 1]
        assert later == free[:free.index(eos, first + 1) + 1]  # the first EOS at position min_tokens or later
        assert through == free and free.count(eos) > 1  # EOS more than once, and every token the free decode's
        assert other == Baseline(target, eos_id=eos).generate(PROMPTS[2], 40).tokens


def test_the_pool_is_allocated_once_and_steps_never_exceed_max_batch(pair):
    target, draft = pair
    spec = Speculative(target, draft, gamma=4)
    _, sizes = serve(spec, PROMPTS, LENGTHS, 4)
    pool = [spec.cache, spec.drafter.cache]  # the target's, and the draft model's (its drafter's)
    assert [c.batch_size for c in pool] == [4, 4] and max(sizes) <= 4
    serve(spec, PROMPTS, LENGTHS, 3)
    spec.generate([1, 2], 5)
    assert spec.cache is pool[0] and spec.drafter.cache is pool[1]  # reused, not allocated per request


def test_batch_sizes_are_recorded_per_row(pair):
    target, _ = pair
    results = Baseline(target).generate_batch(PROMPTS[:3], 10, [SamplingParams()] * 3, max_batch=2)
    assert [r.stats.batch_steps for r in results] == [{2: 9}, {2: 9}, {1: 9}]
    assert all(r.stats.forwards == pytest.approx(4.5 if i < 2 else 9) for i, r in enumerate(results))


def test_sampled_batched_rows_follow_their_own_seeds(pair):
    """A row's draws come from its own generator: its sampled tokens do not depend on its batch."""
    target, draft = pair
    params = SamplingParams(temperature=1.0)
    for sut in (Baseline(target), Speculative(target, draft, gamma=3)):
        alone = [sut.generate(p, n, params.for_sample(i)).tokens for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
        assert serve(sut, PROMPTS, LENGTHS, 4, params)[0] == alone


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_max_batch_is_a_clear_error(pair, bad):
    target, _ = pair
    with pytest.raises(ValueError, match="max_batch must be a positive integer"):
        Scheduler(Baseline(target), bad)


@pytest.mark.parametrize("budget", [1, 5, 12])  # shorter than most prompts, than some, than none but one
def test_chunked_prefill_emits_the_unbatched_baseline_tokens_with_any_token_budget(pair, expected, budget):
    """Prompts prefill in chunks of what each step leaves of the budget, several prompts in one packed forward."""
    target, draft = pair
    for sut in (Baseline(target), Speculative(target, draft, gamma=3)):
        chunks, prefill = [], sut.prefill
        sut.prefill = lambda first, seqs, sizes: chunks.append(sizes) or prefill(first, seqs, sizes)
        assert serve(sut, PROMPTS, LENGTHS, 3, token_budget=budget)[0] == expected
        assert any(len(c) > 1 for c in chunks) == (budget > 1) and max(map(sum, chunks)) <= budget


def test_a_sequence_arriving_mid_prefill_and_eos_inside_a_chunked_run(pair):
    """A prompt submitted while another is half prefilled; a row reaching EOS while others prefill in chunks."""
    target, draft = pair
    long = list(range(1, 30))
    eos = Baseline(target).generate(PROMPTS[2], 40).tokens[6]
    for sut in (Baseline(target, eos_id=eos), Speculative(target, draft, eos_id=eos, gamma=2)):
        alone = [Baseline(target, eos_id=eos).generate(p, 30).tokens for p in (long, PROMPTS[2], PROMPTS[1])]
        assert len(alone[1]) < 30  # this one stops at EOS
        scheduler = Scheduler(sut, 3, token_budget=6)
        seqs = [Sequence(p, 30, SamplingParams()) for p in (long, PROMPTS[2], PROMPTS[1])]
        scheduler.submit(seqs[0])
        scheduler.iterate()
        assert seqs[0].prefilled == 6 and not seqs[0].tokens  # half prefilled
        for seq in seqs[1:]:
            scheduler.submit(seq)
        scheduler.run()
        assert [s.tokens for s in seqs] == alone


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_token_budget_is_a_clear_error(pair, bad):
    target, _ = pair
    with pytest.raises(ValueError, match="token_budget must be a positive integer"):
        Scheduler(Baseline(target), 2, bad)


def test_tokens_stream_step_by_step_and_a_cancelled_row_is_freed_the_others_unchanged(pair, expected):
    """on_tokens sees every token once, in order; a sequence cancelled mid-run leaves at the next iteration
    (no on_done), its row is reused, and the rows beside it still emit exactly the unbatched tokens."""
    target, draft = pair
    streamed, done = {i: [] for i in range(len(PROMPTS))}, []
    sut, scheduler = Speculative(target, draft, gamma=3), None

    def on_tokens(i, new):
        streamed[i].extend(new)
        if i == 4 and len(streamed[4]) >= 5:
            seqs[4].cancelled = True
    seqs = [Sequence(p, n, SamplingParams(), on_tokens=lambda new, i=i: on_tokens(i, new),
                     on_done=lambda result, i=i: done.append(i)) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
    scheduler = Scheduler(sut, 3)
    scheduler.run(seqs)
    assert not scheduler.busy and scheduler.rows == 0
    assert sorted(done) == [i for i in range(len(PROMPTS)) if i != 4]
    assert 5 <= len(streamed[4]) < LENGTHS[4] and streamed[4] == expected[4][:len(streamed[4])]
    assert all(streamed[i] == seqs[i].tokens == expected[i] for i in done)

