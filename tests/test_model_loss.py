"""The chunked output-layer loss against plain autograd, and the training layout (packing,
positions, noise) against its definition."""

from __future__ import annotations

import pytest
import torch
from dicepipe.model.layout import build_rows, make_train_batch, pack_examples, sample_noise
from dicepipe.model.loss import linear_cross_entropy_sum
from dicepipe.model.sampling import sample_tokens, select_transfers, transfer_schedule
from dicepipe.model.tokenizer import IGNORE_INDEX, SFTExample


@pytest.mark.parametrize("chunk_rows", [3, 1024])
def test_linear_cross_entropy_matches_autograd(chunk_rows):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (10,), generator=gen)
    weights = torch.rand(10, generator=gen, dtype=torch.float64) * 5
    loss = linear_cross_entropy_sum(hidden, weight, targets, weights, chunk_rows)
    (loss * 0.7).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ce = torch.nn.functional.cross_entropy(hidden @ weight.T, targets, reduction="none")
    ref = (ce * weights).sum()
    (ref * 0.7).backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-6, atol=1e-8)


def test_linear_cross_entropy_of_no_rows_is_zero_with_gradients():
    hidden = torch.zeros(0, 8, requires_grad=True)
    weight = torch.randn(5, 8, requires_grad=True)
    loss = linear_cross_entropy_sum(hidden, weight, torch.zeros(0, dtype=torch.long), torch.zeros(0))
    loss.backward()
    assert float(loss.detach()) == 0.0 and weight.grad is not None


def test_pack_examples_first_fit_decreasing():
    rows = pack_examples([8, 4, 12, 4, 20], capacity=16)
    assert rows == [[1, 2], [0, 3]]  # 12 opens a row, 8 another, the first 4 fills 12's row
    flat = sorted(i for row in rows for i in row)
    assert flat == [0, 1, 2, 3]  # the 20-token example does not fit and is left out
    lengths = [8, 4, 12, 4]
    assert all(sum(lengths[i] for i in row) <= 16 for row in rows)
    assert len(rows) == 2


def _examples():
    # prompt (ignored labels) then response; lengths multiples of the block size 4
    a = SFTExample(tuple(range(10, 18)), (IGNORE_INDEX,) * 3 + tuple(range(13, 18)))
    b = SFTExample(tuple(range(30, 42)), (IGNORE_INDEX,) * 5 + tuple(range(35, 42)))
    return a, b


def test_rows_positions_restart_per_sample_and_padding_is_its_own_sample():
    a, b = _examples()
    rows = build_rows([[a, b]], 24, pad_token_id=0)
    assert rows.position_ids[0].tolist() == list(range(8)) + list(range(12)) + list(range(4))
    assert rows.doc_ids[0].tolist() == [0] * 8 + [1] * 12 + [2] * 4
    assert rows.labels[0, 20:].eq(IGNORE_INDEX).all()


def test_noise_one_level_per_sample_prompt_never_masked():
    a, b = _examples()
    rows = build_rows([[a, b], [b]], 24, pad_token_id=0)
    for seed in range(20):
        masked, p_tok = sample_noise(rows, 1e-3, torch.Generator().manual_seed(seed))
        assert not masked[rows.labels == IGNORE_INDEX].any()
        for doc in range(int(rows.doc_ids.max()) + 1):
            in_doc = rows.doc_ids == doc
            assert p_tok[in_doc].unique().numel() == 1
            if (rows.labels[in_doc] != IGNORE_INDEX).any():
                assert masked[in_doc].any()  # at least one masked token per trained sample
    batch = make_train_batch(rows, 99, 1e-3, torch.Generator().manual_seed(0))
    n = rows.input_ids.shape[1]
    assert torch.equal(batch.input_ids[:, n:], rows.input_ids)
    assert torch.equal(batch.input_ids[:, :n][batch.masked], torch.full_like(batch.targets, 99))
    assert torch.equal(batch.position_ids[:, :n], batch.position_ids[:, n:])
    torch.testing.assert_close(batch.weights, 1.0 / p_tok_for(batch, rows))
    assert batch.num_label_tokens == int((rows.labels != IGNORE_INDEX).sum())


def p_tok_for(batch, rows):
    _, p_tok = sample_noise(rows, 1e-3, torch.Generator().manual_seed(0))
    return p_tok[batch.masked].float()


def test_transfer_selection_strategies():
    masked = torch.tensor([[True, True, True, False], [True, True, True, True]])
    conf = torch.tensor([[0.2, 0.95, 0.5, 0.99], [0.91, 0.1, 0.92, 0.93]])
    count = torch.tensor([1, 1])
    static = select_transfers(masked, conf, count, "static", 0.9)
    assert static.tolist() == [[False, True, False, False], [False, False, False, True]]
    seq = select_transfers(masked, conf, count, "sequential", 0.9)
    assert seq.tolist() == [[True, False, False, False], [True, False, False, False]]
    dyn = select_transfers(masked, conf, count, "dynamic", 0.9)
    assert dyn.tolist() == [[False, True, False, False], [True, False, True, True]]
    assert transfer_schedule(torch.tensor([4, 3, 2]), 4).tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    assert transfer_schedule(torch.tensor([5]), 2).tolist() == [[3, 2]]


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(200, 1)
    tokens, conf = sample_tokens(logits, 1.0, 2, 1.0, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {2, 3}
    probs = torch.softmax(logits[0], -1)
    assert torch.allclose(conf, probs[tokens])  # confidence before filtering
    tokens, _ = sample_tokens(logits, 1.0, 0, 0.5, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {3}  # p(3) = 0.64 >= 0.5 alone
    greedy, conf = sample_tokens(logits[:1], 0.0, 0, 1.0)
    assert greedy.tolist() == [3] and abs(float(conf) - float(probs[3])) < 1e-6
