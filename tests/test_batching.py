"""The shared-prefix forward (trainers/batching.py): each distinct prompt encoded once, followed by its group's
completions under a mask by which each sees its prompt and itself. It must give the packed forward's per-token
log-probabilities and gradients, with activations kept or recomputed, and the same bits every time."""

from __future__ import annotations

import pytest
import torch

from trainers import load_model
from trainers.batching import SharedPrefixBatch, _chosen_logps, chosen_logps, completion_logps, pack, pack_shared
from trainers.loop import checkpointed, recompute_activations

pytestmark = pytest.mark.integration


def groups(vocab: int, prompts: int, group: int, seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """`prompts` prompts of uneven lengths, each with `group` completions of uneven lengths (one a single token)."""
    g = torch.Generator().manual_seed(seed)
    prompt_rows, completion_rows = [], []
    for i in range(prompts):
        prompt = torch.randint(3, vocab, (24 - 5 * i,), generator=g).tolist()
        for j in range(group):
            length = 1 if j == group - 1 else 9 - 2 * j
            prompt_rows.append(prompt)
            completion_rows.append(torch.randint(3, vocab, (length,), generator=g).tolist())
    return prompt_rows, completion_rows


def logps_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logps = completion_logps(model, batch, temperature=0.7)
    (logps * batch.completion_mask * torch.linspace(-1, 1, logps.shape[1], dtype=logps.dtype)).sum().backward()
    return logps.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def model(request):
    """In float64: in float32 the two forwards round differently (the same sums in another order), and over 30
    layers that reaches 2e-4 of a gradient tensor's largest entry, which would hide a real difference. In float64
    what is left is the float32 inside the models' RMSNorm, under 1e-6."""
    loaded = load_model(request.param)
    loaded.model.double().train(False)  # no dropout: both forwards see the same function
    return loaded


# Groups of 2 and 4 on the tiny model; the 135M model (30 layers, where rounding would hide a difference) at the
# larger group only: in float64 each case of it is 20-60 s of a 2-core machine.
@pytest.mark.parametrize("model, group", [("tiny", 2), ("tiny", 4), ("smollm2-135m", 4)], indirect=["model"])
def test_shared_prefix_and_packed_forward_give_equal_logprobs_and_gradients(model, group):
    vocab = min(model.model.config.vocab_size, 5000)
    prompts, completions = groups(vocab, 3, group)
    pad = model.tokenizer.pad_token_id
    shared = pack_shared(prompts, completions, pad)
    assert shared.prompt_ids.shape[0] == 3  # each prompt once
    packed_logps, packed_grads = logps_and_grads(model.model, pack(prompts, completions, pad))
    shared_logps, shared_grads = logps_and_grads(model.model, shared)

    real = shared.completion_mask.bool()
    assert (packed_logps[real] - shared_logps[real]).abs().max().item() <= 1e-5
    assert packed_grads.keys() == shared_grads.keys() and packed_grads
    for name, packed in packed_grads.items():
        assert (packed - shared_grads[name]).abs().max().item() <= 1e-5 * packed.abs().max().item(), name


def test_a_gradient_checkpointed_model_takes_the_shared_prefix_forward_too():
    """Activations recomputed in the backward pass (the default agent's and simulator's updates): the same
    log-probabilities and gradients as the packed forward of the same rows."""
    loaded = load_model("tiny")
    loaded.model.double()
    prompts, completions = groups(200, 2, 4)
    pad = loaded.tokenizer.pad_token_id
    expected, expected_grads = logps_and_grads(loaded.model, pack(prompts, completions, pad))
    recompute_activations(loaded.model)  # as the trainers turn it on
    loaded.model.train(True)  # gradient checkpointing acts in training mode only; tiny has no dropout
    shared = pack_shared(prompts, completions, pad)
    logps, grads = logps_and_grads(loaded.model, shared)
    real = shared.completion_mask.bool()
    assert checkpointed(loaded.model)
    assert torch.allclose(logps[real], expected[real], atol=1e-6) and grads.keys() == expected_grads.keys()
    for name, packed in expected_grads.items():
        assert torch.allclose(grads[name], packed, atol=1e-6 * packed.abs().max().item()), name


def test_eager_attention_takes_the_shared_prefix_mask_as_scores_to_add():
    """Eager attention adds its mask to the scores (sdpa takes a boolean one): the same log-probabilities and
    gradients as sdpa's packed forward. (Eager's own packed forward of left-padded rows is NaN: a padding query
    sees no key, and its NaN reaches the real rows as 0 x NaN. The shared-prefix mask lets every query see itself.)"""
    loaded = load_model("tiny")
    loaded.model.double()
    prompts, completions = groups(200, 2, 4)
    pad = loaded.tokenizer.pad_token_id
    expected, expected_grads = logps_and_grads(loaded.model, pack(prompts, completions, pad))  # sdpa, packed
    loaded.model.set_attn_implementation("eager")
    shared = pack_shared(prompts, completions, pad)
    logps, grads = logps_and_grads(loaded.model, shared)
    real = shared.completion_mask.bool()
    assert loaded.model.config._attn_implementation == "eager"
    assert torch.allclose(logps[real], expected[real], atol=1e-6) and grads.keys() == expected_grads.keys()
    for name, packed in expected_grads.items():
        assert torch.allclose(grads[name], packed, atol=1e-6 * packed.abs().max().item()), name


def test_packed_rows_of_a_shared_batch_are_the_packed_batch():
    prompts, completions = groups(200, 2, 3)
    direct, via = pack(prompts, completions, 0), pack_shared(prompts, completions, 0).packed()
    for field in ("input_ids", "attention_mask", "completion_ids", "completion_mask"):
        assert torch.equal(getattr(direct, field), getattr(via, field)), field
    assert isinstance(pack_shared(prompts, completions, 0), SharedPrefixBatch)


def test_the_shared_prefix_backward_gives_the_same_bits_every_time():
    """Replay retrains a checkpoint bit for bit, so the gradient that reaches a shared prompt must not depend on
    the order in which threads add the rows' parts; at this size indexing's backward (index_add) does, on the CPU.
    The rows' first logits, which a group shares, are picked as a product instead (`pick_rows`)."""
    from trainers.batching import pick_rows

    logits = torch.randn(2, 1, 49152, generator=torch.Generator().manual_seed(0), requires_grad=True)
    rows = torch.tensor([0] * 8 + [1] * 8)
    upstream = torch.randn(16, 1, 49152, generator=torch.Generator().manual_seed(1))
    grads = []
    for _ in range(6):
        logits.grad = None
        picked = pick_rows(logits, rows, 2)
        assert torch.equal(picked, logits[rows])  # exact forward
        (picked * upstream).sum().backward()
        grads.append(logits.grad.clone())
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_each_completion_sees_its_prompt_and_itself_only():
    from trainers.batching import prefix_tree

    shared = pack_shared([[5, 6, 7], [5, 6, 7], [8, 9]], [[1, 2], [3], [4, 4, 4]], pad_id=0)
    tree = prefix_tree(shared)
    P, C = 3, 3
    assert tree.input_ids.tolist() == [[5, 6, 7, 1, 2, 0, 3, 0, 0], [0, 8, 9, 4, 4, 4, 0, 0, 0]]
    assert tree.position_ids[0, P:].tolist() == [3, 4, 5, 3, 4, 5]  # each slot continues its prompt's positions
    assert tree.position_ids[1, P : P + C].tolist() == [2, 3, 4]  # after a prompt of 2 tokens (and a pad)
    sees = tree.attention[0, 0]
    assert sees[4].tolist() == [True] * 5 + [False] * 4  # the first row's second token: its prompt and its slot
    assert sees[6].tolist() == [True] * 3 + [False] * 3 + [True] + [False] * 2  # the second row's: not the first's
    assert tree.attention[1, 0, :, 0].tolist() == [True] + [False] * 8  # the second prompt's pad: by itself alone


def test_log_probabilities_taken_a_row_at_a_time_are_the_same_bits_as_in_one_piece():
    """chosen_logps recomputes its float32 work row by row in the backward pass (to keep the peak down): the values
    and the logits' gradients must be those of the one-piece computation, bit for bit, in bf16 as in fp32."""
    for dtype in (torch.bfloat16, torch.float32):
        generator = torch.Generator().manual_seed(0)
        logits = (torch.randn(5, 7, 300, generator=generator) * 4).to(dtype)
        chosen = torch.randint(0, 300, (5, 7), generator=generator)
        weights = torch.randn(5, 7, generator=generator)
        results = []
        for take in (chosen_logps, _chosen_logps):
            leaf = logits.clone().requires_grad_(True)
            logps = take(leaf, chosen, 0.7)
            (logps * weights).sum().backward()
            results.append((logps.detach(), leaf.grad))
        (row_by_row, row_grad), (whole, whole_grad) = results
        assert row_by_row.dtype == torch.float32 and torch.equal(row_by_row, whole)
        assert torch.equal(row_grad, whole_grad) and row_grad.abs().sum() > 0
        with torch.no_grad():  # no backward to come: one piece
            assert torch.equal(chosen_logps(logits, chosen, 0.7), whole)
