"""GRPO and RWR on real tiny models: they learn, they are deterministic, and bad input stops them cleanly.

The toy task has a checkable answer: the reward of a completion is the share of its characters
that are digits. A randomly initialised byte-level model writes digits ~4% of the time.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import genenv_cli, genenv_inline

from engine.coevolution import publish_checkpoint
from lake import Lake, ingest, read_pool
from streams import BatchScored, EventProducer, RewardScored, RolloutCompleted, TaskGenerated
from trainers import (
    CPU,
    CheckpointError,
    GRPOConfig,
    GRPOTrainer,
    RWRConfig,
    RWRTrainer,
    SamplingConfig,
    TrainError,
    TransformersBackend,
    load_checkpoint,
    load_model,
    registry,
    render_prompt,
    rwr_weights,
    train_update,
)
from trainers.grpo import GUIDE_SUFFIX
from trainers.grpo import select_rows as select_rollouts
from trainers.rwr import select_rows as select_generations

DIGITS = set("0123456789")


def digit_share(text: str) -> float:
    return sum(c in DIGITS for c in text) / max(len(text), 1)


def sample(loaded, prompts: list[str], group: int, seed: int, tokens: int = 8):
    backend = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=64)
    return backend.generate(
        [p for p in prompts for _ in range(group)], SamplingConfig(max_new_tokens=tokens, seed=seed)
    )


def rollout_rows(generations, group: int, version: str = "0") -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "rollout_id": f"r{i}",
                "task_id": f"t{i // group}",
                "group_index": i % group,
                "agent_model_version": version,
                "prompt": g.prompt,
                "completion": g.text,
                "completion_token_ids": g.token_ids,
                "behaviour_logprobs": g.logprobs,
                "reward": digit_share(g.text),
            }
            for i, g in enumerate(generations)
        ]
    )


def mean_reward(generations) -> float:
    return sum(digit_share(g.text) for g in generations) / len(generations)


@pytest.mark.unit
def test_grpo_raises_the_mean_reward_on_tiny():
    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(8)]
    config = GRPOConfig(learning_rate=3e-3, per_device_train_batch_size=64)
    trainer = GRPOTrainer(agent.model, agent.tokenizer, config)
    before = mean_reward(sample(agent, prompts, 8, seed=999))
    for step in range(12):
        rows, dropped = select_rollouts(rollout_rows(sample(agent, prompts, 8, seed=100 + step), 8), 0, config)
        assert set(dropped) <= {"zero_std_group"}  # groups whose eight rewards are all equal (all digit-free)
        trainer.train(rows)
    after = mean_reward(sample(agent, prompts, 8, seed=999))
    assert after > 2 * before and after > 0.1, (before, after)


@pytest.mark.unit
def test_frozen_embeddings_stay_as_they_were_and_hold_no_optimiser_state():
    from trainers import OptimizerState

    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(4)]
    config = GRPOConfig(learning_rate=3e-3, per_device_train_batch_size=16, freeze_embeddings=True, filter_groups=False)
    trainer = GRPOTrainer(agent.model, agent.tokenizer, config)
    embeddings = agent.model.get_input_embeddings().weight
    assert agent.model.get_output_embeddings().weight is embeddings  # tied: the output head is frozen with them
    before = {name: p.detach().clone() for name, p in agent.model.named_parameters()}
    state = OptimizerState()
    rows, _ = select_rollouts(rollout_rows(sample(agent, prompts, 4, seed=5), 4), 0, config)
    trainer.train(rows, state=state)
    changed = {name for name, p in agent.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and "model.embed_tokens.weight" not in changed
    assert len(state.optimizer["state"]) == len(before) - 1  # moments for every weight but the embeddings
    # An update that trains the embeddings cannot continue that state: it says why, before any step.
    thawed = GRPOTrainer(load_model("tiny", seed=0).model, agent.tokenizer, GRPOConfig(filter_groups=False))
    with pytest.raises(ValueError, match="freeze_embeddings differs"):
        thawed.train(rows, state=state)


@pytest.mark.unit
def test_the_ratio_is_taken_against_the_trainers_policy_and_the_samplers_logprobs_only_weight_it():
    """As TRL: the denominator is the parent's log-probabilities as this model computes them, and the sampler's
    (another engine's: here the transformers backend's, shifted as bf16 kernels would shift them) enter only as
    min(pi_parent / pi_sampler, cap) per token."""
    from trainers.batching import completion_logps
    from trainers.grpo import grouped_order

    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(4)]
    config = GRPOConfig(per_device_train_batch_size=8, filter_groups=False, importance_sampling_cap=2.0)
    rows = rollout_rows(sample(agent, prompts, 4, seed=5), 4)
    shift = torch.linspace(-1.5, 0.5, 16).tolist()  # per row: the sampler put more, or less, mass on its tokens
    rows = rows.with_columns(
        pl.Series("behaviour_logprobs", [[lp + d for lp in lps] for lps, d in zip(rows["behaviour_logprobs"], shift)])
    )
    rows, _ = select_rollouts(rows, 0, config)
    trainer = GRPOTrainer(agent.model, agent.tokenizer, config)
    order = grouped_order(rows["task_id"].to_list(), config.seed)  # the micro-batches' order of rows
    weights = []
    for k, mb in enumerate(trainer.micro_batches(rows)):
        mask = mb.tokens.completion_mask.bool()
        with torch.no_grad():
            own = completion_logps(agent.model, mb.tokens)
        assert torch.equal(mb.old_logps[mask], own[mask])
        width = mb.old_logps.shape[1]
        logprobs = [rows["behaviour_logprobs"][i].to_list() for i in order[8 * k : 8 * (k + 1)]]
        sampled = torch.tensor([lps + [0.0] * (width - len(lps)) for lps in logprobs])
        expected = torch.exp(own - sampled).clamp(max=2.0)
        assert torch.allclose(mb.token_weights[mask], expected[mask], atol=1e-6)
        weights.append(mb.token_weights[mask])
    assert torch.cat(weights).max() == 2.0 and torch.cat(weights).min() < 0.7  # capped above, and below 1


@pytest.mark.unit
def test_a_checkpointed_update_takes_the_ratios_denominator_from_the_forward_pass_it_trains_with():
    """With gradient checkpointing a model scores whole rows (no shared prompt's cache), and the micro-batches'
    log-probabilities at the start of the update must come from that same pass: in bf16 the shared-prompt pass and
    the whole-row pass round differently, and the first step's ratio would start away from 1."""
    from trainers.batching import completion_logps
    from trainers.loop import recompute_activations

    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(4)]
    config = GRPOConfig(per_device_train_batch_size=8, filter_groups=False, gradient_checkpointing=True)
    rows, _ = select_rollouts(rollout_rows(sample(agent, prompts, 4, seed=5), 4), 0, config)

    def compute():
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)

    trainer = GRPOTrainer(agent.model, agent.tokenizer, config, compute=compute)
    batches = trainer.micro_batches(rows)
    recompute_activations(agent.model)  # what `optimise` asks before its first step (once a model)
    agent.model.train()
    for mb in batches:
        mask = mb.tokens.completion_mask.bool()
        with compute():
            trained = completion_logps(agent.model, mb.tokens, config.temperature).float()
        assert torch.equal(mb.old_logps[mask], trained.detach()[mask])


@pytest.mark.unit
def test_dapo_normalises_each_micro_batch_by_its_steps_tokens():
    """loss_type dapo (TRL's default): a step's loss is its token sum over every completion token of the step, so
    each micro-batch carries the step's tokens per micro-batch (optimise averages the step's micro-batches)."""
    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(4)]
    config = GRPOConfig(loss_type="dapo", per_device_train_batch_size=4, gradient_accumulation_steps=3)
    rows, _ = select_rollouts(
        rollout_rows(sample(agent, prompts, 4, seed=5), 4), 0, config.__class__(filter_groups=False)
    )
    batches = GRPOTrainer(agent.model, agent.tokenizer, config).micro_batches(rows)
    assert len(batches) == 4  # steps of 3 and 1 micro-batches
    for step in (batches[:3], batches[3:]):
        tokens = sum(float(mb.tokens.completion_mask.sum()) for mb in step)
        assert {mb.step_tokens for mb in step} == {tokens / len(step)}


def answer_nll(loaded, anchor: pl.DataFrame) -> float:
    """The mean token NLL of the anchor's texts given their prompts, as the ptx term computes it."""
    import torch

    from trainers.batching import completion_logps, pack, supervised_ids
    from trainers.losses import token_nll

    tok = loaded.tokenizer
    batch = pack(*supervised_ids(tok, anchor["prompt"].to_list(), anchor["text"].to_list()), tok.pad_token_id)
    with torch.no_grad():
        return token_nll(completion_logps(loaded.model, batch), batch.completion_mask).item()


@pytest.mark.unit
def test_the_ptx_term_trains_the_warm_start_answers_beside_grpo():
    prompts_of = lambda tok: [render_prompt(tok, f"count {i}") for i in range(4)]  # noqa: E731
    anchor_of = lambda tok: pl.DataFrame(  # noqa: E731
        {"prompt": [render_prompt(tok, f"recite {i}") for i in range(3)], "text": ["abc", "def", "ghi"]}
    )
    nll = {}
    for coef in (0.0, 1.0):
        agent = load_model("tiny", seed=0)
        anchor = anchor_of(agent.tokenizer)
        before = answer_nll(agent, anchor)
        config = GRPOConfig(learning_rate=3e-3, per_device_train_batch_size=8, ptx_coef=coef, ptx_batch_size=2)
        trainer = GRPOTrainer(agent.model, agent.tokenizer, config, anchor=anchor)
        rows, _ = select_rollouts(rollout_rows(sample(agent, prompts_of(agent.tokenizer), 8, seed=5), 8), 0, config)
        batches = trainer.micro_batches(rows)
        if coef:  # every micro-batch carries two anchor rows, taken in turn
            assert all(mb.reference_answers.input_ids.shape[0] == 2 for mb in batches)
        else:
            assert trainer.anchor is None and all(mb.reference_answers is None for mb in batches)
        metrics = {}
        for _ in range(4):
            metrics = trainer.train(rows)
        assert metrics["ptx_rows"] == (3 if coef else 0) and ("ptx_nll" in metrics) == bool(coef)
        nll[coef] = (before, answer_nll(agent, anchor))
    assert nll[0.0][0] == nll[1.0][0]  # the same start
    assert nll[1.0][1] < 0.5 * nll[1.0][0] and nll[1.0][1] < nll[0.0][1], nll


@pytest.mark.unit
def test_the_ptx_rows_continue_across_a_lineages_updates_until_every_answer_is_trained():
    """Each update takes its ptx rows from where the lineage's earlier updates left the anchor's order. Started again
    from the top each update, the default's updates of 8 micro-batches of 2 rows trained the same 16 of the warm
    start's 24 answers every time, and never the other 8 (docs/RESULTS.md, "The ptx rows in turn")."""
    from trainers import OptimizerState

    agent = load_model("tiny", seed=0)
    tok = agent.tokenizer
    texts = ["abc", "def", "ghi", "jkl", "mno", "pqr"]
    anchor = pl.DataFrame({"prompt": [render_prompt(tok, f"recite {i}") for i in range(6)], "text": texts})
    config = GRPOConfig(
        learning_rate=1e-4, per_device_train_batch_size=16, filter_groups=False, num_iterations=2, ptx_coef=0.3
    )
    trainer = GRPOTrainer(agent.model, tok, config, anchor=anchor)
    rows, _ = select_rollouts(rollout_rows(sample(agent, [render_prompt(tok, "count")], 16, seed=5), 16), 0, config)
    state, trained = OptimizerState(), []
    for _ in range(3):  # one micro-batch an update, seen twice (num_iterations): 2 steps, 2 anchor rows
        (batch,) = trainer.micro_batches(rows, state.step)
        answers = batch.reference_answers
        trained.append(
            {
                tok.decode(ids[mask.bool()], skip_special_tokens=True)
                for ids, mask in zip(answers.completion_ids, answers.completion_mask)
            }
        )
        trainer.train(rows, state=state)
    assert state.step == 6
    assert all(len(update) == 2 for update in trained) and set().union(*trained) == set(texts), trained


@pytest.mark.unit
def test_the_grpo_term_runs_its_forward_pass_after_the_ptx_terms_backward():
    """A micro-batch's loss comes in terms that `optimise` backpropagates one at a time, so the ptx rows' forward
    pass never shares memory with the GRPO rows' activations; the gradients are those of the terms' sum."""
    agent = load_model("tiny", seed=0)
    tok, params = agent.tokenizer, list(agent.model.parameters())
    anchor = pl.DataFrame(
        {"prompt": [render_prompt(tok, f"recite {i}") for i in range(3)], "text": ["abc", "def", "ghi"]}
    )
    config = GRPOConfig(per_device_train_batch_size=8, ptx_coef=0.5, ptx_batch_size=2)
    trainer = GRPOTrainer(agent.model, tok, config, anchor=anchor)
    prompts = [render_prompt(tok, f"count {i}") for i in range(4)]
    rows, _ = select_rollouts(rollout_rows(sample(agent, prompts, 8, seed=5), 8), 0, config)
    batch = trainer.micro_batches(rows)[0]
    had_gradients = []  # at each embedding lookup (one a term's forward): had a backward run?
    embeddings = agent.model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda *_: had_gradients.append(any(p.grad is not None for p in params)))
    terms = trainer.loss(batch, agent.model)
    ptx_term, metrics = next(terms)
    ptx_term.backward()
    grpo_term, _ = next(terms)
    grpo_term.backward()
    hook.remove()
    assert had_gradients == [False, True]  # the GRPO rows' forward came after the ptx term's backward
    assert list(terms) == [] and "ptx_nll" in metrics
    one_at_a_time = [p.grad.clone() for p in params]
    agent.model.zero_grad(set_to_none=True)
    sum(loss for loss, _ in trainer.loss(batch, agent.model)).backward()  # both graphs alive, one backward
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(one_at_a_time, params))


# A warm start's rows and options in the SFT tests: 6 rows in micro-batches of 2, accumulated 2 a step.
SFT_OPTIONS = dict(
    learning_rate=3e-3,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    kl_coef=0.0,
    num_train_epochs=8,
    seed=3,
)


def sft_rows(tokenizer) -> pl.DataFrame:
    return pl.DataFrame(
        {"prompt": [render_prompt(tokenizer, f"recite {i}") for i in range(6)], "text": ["abc", "def", "ghi"] * 2}
    )


@pytest.mark.unit
def test_the_warm_start_is_trls_sft_on_the_completion_tokens_only_and_is_deterministic():
    """The seed warm start trains through TRL's SFTTrainer (trainers/sft.py) on ids tokenized as every other part
    of genenv does (the prompt's ids, then the text with end-of-sequence); only the completion is learnt, and the
    same rows, options and seed give the same weights bit for bit (a replay of epoch 0 retrains it)."""
    from trainers.batching import supervised_ids
    from trainers.sft import completion_rows, train_sft

    options = RWRConfig(**SFT_OPTIONS)
    trained, ticks = [], []
    for _ in range(2):
        agent = load_model("tiny", seed=0)
        rows = sft_rows(agent.tokenizer)
        data = completion_rows(agent.tokenizer, rows)
        prompts, texts = supervised_ids(agent.tokenizer, rows["prompt"].to_list(), rows["text"].to_list())
        assert data["input_ids"][0] == prompts[0] + texts[0] and texts[0][-1] == agent.tokenizer.eos_token_id
        assert data["completion_mask"][0] == [0] * len(prompts[0]) + [1] * len(texts[0])
        before = answer_nll(agent, rows)
        metrics = train_sft(agent.model, agent.tokenizer, rows, options, CPU, lambda done, total: ticks.append(total))
        assert answer_nll(agent, rows) < 0.5 * before
        assert agent.model.config.use_cache  # as it was: SFTTrainer turns it off, and the checkpoint would keep that
        # 6 rows in micro-batches of 2, accumulated 2 a step: 2 steps a pass, 8 passes.
        assert metrics["optimizer_steps"] == 16 and metrics["trainer"] == "trl.SFTTrainer" and metrics["rows"] == 6
        trained.append({k: v.clone() for k, v in agent.model.state_dict().items()})
    assert ticks[-1] == 16
    assert all(torch.equal(trained[0][k], trained[1][k]) for k in trained[0])


@pytest.mark.unit
def test_the_warm_starts_activation_checkpointing_changes_its_memory_not_its_weights():
    """The simulator's warm start recomputes its activations in the backward pass (engine/coevolution/sync.py): the
    same rows, options and seed give the weights of the SFT that keeps them."""
    from trainers.sft import train_sft

    trained = []
    for checkpointing in (False, True):
        agent = load_model("tiny", seed=0)
        options = RWRConfig(**{**SFT_OPTIONS, "num_train_epochs": 2, "gradient_checkpointing": checkpointing})
        train_sft(agent.model, agent.tokenizer, sft_rows(agent.tokenizer), options, CPU)
        assert agent.model.is_gradient_checkpointing == checkpointing
        trained.append({k: v.clone() for k, v in agent.model.state_dict().items()})
    assert all(torch.allclose(trained[0][k], trained[1][k], atol=1e-6) for k in trained[0])
    untrained = load_model("tiny", seed=0).model.state_dict()
    assert any(not torch.equal(trained[0][k], untrained[k]) for k in trained[0])


@pytest.mark.unit
def test_a_warm_start_with_frozen_embeddings_trains_every_other_weight():
    """`freeze_embeddings` holds in a warm start given it: SFTTrainer's optimiser gets every weight but the embeddings
    (and the output head tied to them), which stay the base model's."""
    from trainers.sft import train_sft

    agent = load_model("tiny", seed=0)
    before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    options = RWRConfig(**{**SFT_OPTIONS, "num_train_epochs": 2, "freeze_embeddings": True})
    train_sft(agent.model, agent.tokenizer, sft_rows(agent.tokenizer), options, CPU)
    changed = {k for k, v in agent.model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == set(before) - {"model.embed_tokens.weight", "lm_head.weight"}, set(before) - changed


@pytest.mark.unit
def test_the_warm_starts_completion_only_loss_equals_sfttrainers_own():
    """The warm start scores the completion positions only (trainers/sft.py `completion_sft_trainer`: SFTTrainer's
    fused head scores every position on a CPU); its loss is SFTTrainer's own on the same batch."""
    import tempfile

    from trl import SFTTrainer

    from trainers.sft import completion_rows, completion_sft_trainer, sft_arguments

    agent = load_model("tiny", seed=0)
    tok = agent.tokenizer
    rows = pl.DataFrame(
        {"prompt": [render_prompt(tok, "recite " * (i + 1)) for i in range(4)], "text": ["ab", "c"] * 2}
    )
    options = RWRConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, kl_coef=0.0)
    losses = []
    for trainer_class in (SFTTrainer, completion_sft_trainer()):
        with tempfile.TemporaryDirectory() as out:
            args = sft_arguments(options, CPU, out)
            trainer = trainer_class(
                model=agent.model, args=args, train_dataset=completion_rows(tok, rows), processing_class=tok
            )
            batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
            tokens = (batch["labels"][:, 1:] != -100).sum() * 2  # a step of two such micro-batches
            with torch.no_grad():
                losses.append(
                    [
                        trainer.compute_loss(agent.model, dict(batch), num_items_in_batch=n).item()
                        for n in (None, tokens)
                    ]
                )
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.unit
def test_rwr_moves_the_simulator_toward_high_weight_generations():
    simulator = load_model("tiny", seed=1)
    prompt = render_prompt(simulator.tokenizer, "write a task")
    config = RWRConfig(learning_rate=3e-3, per_device_train_batch_size=64, weight_temperature=0.05, kl_coef=0.0)
    trainer = RWRTrainer(simulator.model, simulator.tokenizer, config)
    before = mean_reward(sample(simulator, [prompt], 64, seed=999))
    for step in range(16):
        generations = sample(simulator, [prompt], 64, seed=200 + step)
        rows = pl.DataFrame(
            [
                {
                    "task_id": f"t{i}",
                    "batch_id": "b",
                    "sim_prompt": g.prompt,
                    "raw_generation": g.text,
                    "valid": True,
                    "filtered": False,
                    "env_reward": digit_share(g.text),
                }
                for i, g in enumerate(generations)
            ]
        )
        trainer.train(select_generations(rows, config)[0])
    after = mean_reward(sample(simulator, [prompt], 64, seed=999))
    assert after > 2 * before and after > 0.1, (before, after)


@pytest.mark.unit
def test_rwr_scores_the_generations_at_the_temperature_they_were_sampled_at():
    """The weighted NLL is of the tempered distribution the simulator sampled from (logits / temperature): fitted
    at 1.0, samples drawn at 0.5 would pull the model towards their sharper distribution whatever the weights."""
    simulator = load_model("tiny", seed=1)
    prompt = render_prompt(simulator.tokenizer, "write a task")
    generations = sample(simulator, [prompt], 4, seed=5)
    rows = pl.DataFrame(
        {"prompt": [g.prompt for g in generations], "text": [g.text for g in generations], "env_reward": [1.0] * 4}
    )
    losses = {}
    for temperature in (1.0, 0.5):
        config = RWRConfig(per_device_train_batch_size=4, kl_coef=0.0, temperature=temperature)
        trainer = RWRTrainer(simulator.model, simulator.tokenizer, config)
        (batch,) = trainer.micro_batches(rows)
        with torch.no_grad():
            (loss, _), *_ = trainer.loss(batch, simulator.model)
            tokens = batch.tokens
            logits = simulator.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).logits.float()
            logits = logits / temperature
        mask = tokens.completion_mask.float()
        completion = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens.input_ids[:, 1:, None])[..., 0]
        completion = completion[:, -mask.shape[1] :]
        expected = (-(completion * mask).sum(-1) / mask.sum(-1)).mean()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
        losses[temperature] = loss.item()
    assert losses[0.5] != pytest.approx(losses[1.0], rel=1e-2)


@pytest.mark.unit
def test_rwr_takes_its_kl_reference_at_the_sampling_temperature_too():
    """The KL term compares the two tempered distributions: the reference's logprobs are of its logits / temperature."""
    simulator, reference = load_model("tiny", seed=1), load_model("tiny", seed=2)
    prompt = render_prompt(simulator.tokenizer, "write a task")
    generations = sample(simulator, [prompt], 4, seed=5)
    rows = pl.DataFrame(
        {"prompt": [g.prompt for g in generations], "text": [g.text for g in generations], "env_reward": [1.0] * 4}
    )
    config = RWRConfig(per_device_train_batch_size=4, kl_coef=0.05, temperature=0.5)
    trainer = RWRTrainer(simulator.model, simulator.tokenizer, config, ref_model=reference.model)
    (batch,) = trainer.micro_batches(rows)
    tokens = batch.tokens
    with torch.no_grad():
        logits = reference.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).logits.float() / 0.5
    mask = tokens.completion_mask.bool()
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens.input_ids[:, 1:, None])[..., 0]
    expected = expected[:, -mask.shape[1] :]
    assert torch.allclose(batch.ref_logps.float()[mask], expected[mask], atol=1e-4)


def generation_rows(texts, valid, filtered, env_reward, temperature=None) -> pl.DataFrame:
    """d_env rows as RWR's `select_rows` reads them: one batch, one task a generation."""
    columns = {
        "batch_id": ["b"] * len(texts),
        "task_id": [f"t{i}" for i in range(len(texts))],
        "valid": valid,
        "filtered": filtered,
        "sim_prompt": ["p"] * len(texts),
        "raw_generation": texts,
        "env_reward": env_reward,
    }
    return pl.DataFrame(columns if temperature is None else {**columns, "temperature": temperature})


@pytest.mark.unit
def test_rwr_trains_on_the_band_or_on_every_valid_generation_weighted_towards_it():
    rows = generation_rows(
        ["in band", "solved every time", "never solved", "junk"],
        valid=[True, True, True, False],
        filtered=[False, True, True, False],
        env_reward=[1.0, 0.0821, 0.0821, 0.0],
    )
    kept, dropped = select_generations(rows, RWRConfig(band_only=True))  # the paper's filter
    assert kept["text"].to_list() == ["in band"] and dropped == {"filtered": 2, "invalid": 1}
    kept, dropped = select_generations(rows, RWRConfig(band_only=False))
    assert kept["text"].to_list() == ["in band", "solved every time", "never solved"] and dropped == {"invalid": 1}
    weights = rwr_weights(torch.tensor(kept["env_reward"].to_list()), 0.5)
    assert weights[0] > 5 * weights[1] and weights[1] == weights[2]  # the band still counts most


@pytest.mark.unit
def test_rwr_leaves_out_generations_sampled_at_another_temperature():
    """Their likelihood would be scored under another softmax than the one that drew them, as GRPO's rollouts of
    another temperature are left out; rows that record none (seed tasks, older lakes) are kept."""
    rows = generation_rows(
        ["at 0.7", "at 1.0", "not recorded", "junk at 1.0"],
        valid=[True, True, True, False],
        filtered=[False] * 4,
        env_reward=[1.0] * 4,
        temperature=[0.7, 1.0, None, 1.0],
    )
    kept, dropped = select_generations(rows, RWRConfig(temperature=0.7))
    assert kept["text"].to_list() == ["at 0.7", "not recorded"]
    assert dropped == {"other_temperature": 1, "invalid": 1}
    kept, dropped = select_generations(rows, RWRConfig(temperature=1.0))
    assert kept["text"].to_list() == ["at 1.0", "not recorded"]
    assert dropped == {"other_temperature": 1, "invalid": 1}


@pytest.mark.unit
def test_stale_rows_are_dropped_or_importance_weighted():
    agent = load_model("tiny", seed=0)
    rows = rollout_rows(sample(agent, [render_prompt(agent.tokenizer, "x")], 4, seed=1), 4)
    versions = ["3", "2", "1", "junk"]
    rows = rows.with_columns(pl.Series("agent_model_version", versions))
    rows = rows.with_columns(pl.Series("reward", [0.0, 1.0, 0.0, 1.0]))
    kept, dropped = select_rollouts(rows, 3, GRPOConfig(max_staleness=1, off_policy="truncate"))
    assert kept["agent_model_version"].to_list() == ["3", "2"] and kept["staleness"].to_list() == [0, 1]
    assert dropped == {"stale": 1, "unknown_version": 1}
    kept, dropped = select_rollouts(rows, 3, GRPOConfig(max_staleness=1, off_policy="drop", filter_groups=False))
    assert kept["agent_model_version"].to_list() == ["3"] and dropped["stale"] == 2
    # What is left of the group is one row: all its rewards are equal, so dynamic sampling leaves it out.
    kept, dropped = select_rollouts(rows, 3, GRPOConfig(max_staleness=1, off_policy="drop"))
    assert kept.is_empty() and dropped == {"stale": 2, "unknown_version": 1, "zero_std_group": 1}


@pytest.mark.unit
def test_the_audit_says_in_words_why_each_selection_left_a_row_out():
    """Every reason GRPO's and RWR's row selections count a left-out row under reads as words in `genenv audit
    task`, not as the counter's key: rows made to be left out for each reason, selected by the trainers' own code."""
    from engine.lineage.audit import LEFT_OUT, _left_out

    def rollout(task: str, reward: float, version: str = "3", ids=(1, 2), temperature=0.7, turns="") -> dict:
        return {
            "task_id": task,
            "group_index": 0,
            "agent_model_version": version,
            "completion_token_ids": list(ids),
            "behaviour_logprobs": [-0.5] * len(ids),
            "reward": reward,
            "temperature": temperature,
            "turns_json": turns,
        }

    made = (
        [rollout("t0", 0.0), rollout("t0", 1.0), rollout("t1", 0.0), rollout("t1", 1.0)]  # kept; over max_groups
        + [rollout("t2", 1.0), rollout("t2", 1.0)]  # rewards all agree
        + [rollout("t3", 0.0, version="junk"), rollout("t3", 0.0, version="4"), rollout("t3", 0.0, version="1")]
        + [rollout("t3", 0.0, ids=()), rollout("t3", 0.0, temperature=1.0), rollout("t3", 0.0, turns="not json")]
    )
    rows = pl.DataFrame([{**row, "rollout_id": f"r{i:02d}"} for i, row in enumerate(made)])
    config = GRPOConfig(temperature=0.7, max_staleness=1, off_policy="drop", max_groups=1)
    kept, dropped = select_rollouts(rows, 3, config)
    assert kept.height == 2 and set(dropped) == {
        "over_max_groups",
        "zero_std_group",
        "unknown_version",
        "newer_than_parent",
        "stale",
        "no_token_logprobs",
        "other_temperature",
        "unreadable_turns",
    }
    generations = generation_rows(
        ["kept", "junk", "out of band", "at 1.0"],
        valid=[True, False, True, True],
        filtered=[False, False, True, False],
        env_reward=[1.0] * 4,
        temperature=[0.7, 0.7, 0.7, 1.0],
    )
    kept, more = select_generations(generations, RWRConfig(temperature=0.7, band_only=True))
    assert kept.height == 1 and set(more) == {"invalid", "filtered", "other_temperature"}
    assert not {*dropped, *more} - set(LEFT_OUT)
    assert _left_out(["stale", "unreadable_turns"]) == (
        "left out (made by an agent older than max_staleness or off_policy allow, its turns cannot be trained on)"
    )


@pytest.mark.unit
def test_groups_whose_rewards_all_agree_and_rows_of_another_temperature_are_left_out():
    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, p) for p in ("x", "y")]
    rows = rollout_rows(sample(agent, prompts, 4, seed=1), 4)
    assert rows["task_id"].n_unique() == 2
    rows = rows.with_columns(
        pl.Series("reward", [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]), pl.Series("temperature", [1.0] * 7 + [0.5])
    )
    kept, dropped = select_rollouts(rows, 0, GRPOConfig(temperature=1.0))
    assert kept.height == 4 and kept["task_id"].n_unique() == 1 and kept["reward"].to_list() == [1.0, 0.0, 1.0, 1.0]
    assert dropped == {"zero_std_group": 3, "other_temperature": 1}


@pytest.mark.unit
def test_max_groups_keeps_the_groups_whose_rewards_spread_most():
    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, p) for p in ("w", "x", "y", "z")]
    rows = rollout_rows(sample(agent, prompts, 4, seed=1), 4)
    tasks = rows["task_id"].unique(maintain_order=True).to_list()
    # a quarter, a half, three quarters solved, and every rollout solved (no advantage: left out first)
    rewards = [1.0, 0.0, 0.0, 0.0] + [1.0, 0.0, 1.0, 0.0] + [1.0, 1.0, 1.0, 0.0] + [1.0] * 4
    rows = rows.with_columns(pl.Series("reward", rewards))
    kept, dropped = select_rollouts(rows, 0, GRPOConfig(max_groups=2))
    assert kept.height == 8 and tasks[1] in kept["task_id"].to_list()  # the half-solved group spreads most
    assert dropped == {"zero_std_group": 4, "over_max_groups": 4}
    # the tie between a quarter and three quarters is broken by the seed, the same way every time
    again, _ = select_rollouts(rows, 0, GRPOConfig(max_groups=2))
    assert again["rollout_id"].to_list() == kept["rollout_id"].to_list()
    kept, dropped = select_rollouts(rows, 0, GRPOConfig(max_groups=0))
    assert kept.height == 12 and dropped == {"zero_std_group": 4}
    with pytest.raises(ValueError, match="max_groups must be >= 0"):
        GRPOConfig(max_groups=-1).check()
    # A group with a guide row (the reference answer joined to a group that never succeeded: RunConfig.guidance)
    # comes first, though its one success in four spreads less than the half-solved group.
    guided = rows.with_columns(
        pl.Series("reward", [0.0, 0.0, 0.0, 1.0] + rewards[4:]),
        pl.Series("rollout_id", [*rows["rollout_id"][:3], f"{tasks[0]}{GUIDE_SUFFIX}", *rows["rollout_id"][4:]]),
    )
    kept, dropped = select_rollouts(guided, 0, GRPOConfig(max_groups=1))
    assert kept["task_id"].unique().to_list() == [tasks[0]] and dropped["over_max_groups"] == 8


# -- through the lake: pools, checkpoints, the registry, the command line ---------------------------------------


def publish_epoch(
    bootstrap: str, run_id: str = "t", epoch: int = 0, tasks: int = 4, group: int = 4, seed: int = 0
) -> None:
    """One epoch of real tiny-model rollouts (digit-share rewards), as the engine's workers would publish it."""
    agent = load_model("tiny", seed=0)
    prompts = [render_prompt(agent.tokenizer, f"count {i}") for i in range(tasks)]
    generations = sample(agent, prompts, group, seed=seed)
    events = []
    batch_id = f"{run_id}-e{epoch}-b0"
    successes = 0
    for t, prompt in enumerate(prompts):
        task_id = f"{run_id}-e{epoch}-t{t}"
        events.append(
            TaskGenerated(
                run_id=run_id,
                epoch=epoch,
                task_id=task_id,
                batch_id=batch_id,
                domain="toy",
                env_model_version="0",
                sim_prompt=render_prompt(agent.tokenizer, "write a task"),
                raw_generation=f"count {t}",
                task_prompt=prompt,
            )
        )
        for g in range(group):
            gen = generations[t * group + g]
            rollout_id = f"{task_id}-r{g}"
            reward = digit_share(gen.text)
            successes += reward > 0
            events.append(
                RolloutCompleted(
                    run_id=run_id,
                    epoch=epoch,
                    rollout_id=rollout_id,
                    task_id=task_id,
                    group_index=g,
                    agent_model_version="0",
                    prompt=gen.prompt,
                    completion=gen.text,
                    completion_token_ids=gen.token_ids,
                    behaviour_logprobs=gen.logprobs,
                )
            )
            events.append(
                RewardScored(
                    run_id=run_id,
                    epoch=epoch,
                    rollout_id=rollout_id,
                    task_id=task_id,
                    reward=reward,
                    success=reward > 0,
                )
            )
    p_hat = successes / (tasks * group)
    events.append(
        BatchScored(
            run_id=run_id,
            epoch=epoch,
            batch_id=batch_id,
            task_ids=[e.task_id for e in events if e.KIND == "task"],
            granularity="batch",
            p_hat=p_hat,
            env_reward=1 - abs(p_hat - 0.5),
            weight=1.0,
            filtered=False,
            n_tasks=tasks,
            n_rollouts=tasks * group,
            n_success=successes,
        )
    )
    with EventProducer(bootstrap) as producer:
        for event in events:
            producer.send(event)


@pytest.fixture
def pool_lake(broker, lake, runner) -> Lake:
    publish_epoch(broker.bootstrap)
    ingest(lake, broker.bootstrap, idle_exit_s=1.5, runner=runner)
    assert read_pool(lake, "d_train").height == 16 and read_pool(lake, "d_env").height == 4
    return lake


# filter_groups off: these tests count the rows of lineage; dynamic sampling has its own test.
FAST_AGENT = GRPOConfig(
    learning_rate=1e-3, per_device_train_batch_size=4, gradient_accumulation_steps=2, seed=7, filter_groups=False
)


@pytest.mark.integration
def test_same_pool_seed_and_parent_give_a_bit_identical_checkpoint(pool_lake):
    first = train_update("agent", pool_lake, FAST_AGENT, base_model="tiny", parent_version=0)
    second = train_update("agent", pool_lake, FAST_AGENT, base_model="tiny", parent_version=0)
    # Neither is registered: each update reserved its own number (trainers/checkpoints.py `reserve_version`).
    assert (first.version, second.version) == (1, 2) and first.sha256 == second.sha256
    # The seed orders the tasks' groups (4 here, so 24 orders: seeds 7 and 8 happen to draw the same one).
    other_seed = train_update(
        "agent", pool_lake, GRPOConfig(**{**FAST_AGENT.__dict__, "seed": 1}), base_model="tiny", parent_version=0
    )
    assert other_seed.sha256 != first.sha256
    assert first.path == "checkpoints/agent/v1"  # lake-relative: a moved lake stays whole
    lineage = json.loads((Path(pool_lake.root) / first.path / "genenv.json").read_text())
    assert lineage["pool_table"] == "gold/d_train" and lineage["pool_version"] == pool_lake.version("gold/d_train")
    assert lineage["base_model"] == "tiny" and lineage["parent_version"] == 0


@pytest.mark.integration
def test_checkpoints_register_chain_and_load_by_version(pool_lake, broker):
    record = train_update("agent", pool_lake, FAST_AGENT, base_model="tiny")
    publish_checkpoint(pool_lake, broker.bootstrap, record, run_id="t", epoch=0)
    row = registry(pool_lake, "agent").row(0, named=True)
    assert (row["version"], row["parent_version"], row["sha256"]) == (1, 0, record.sha256)
    assert row["pool_version"] == record.pool_version and json.loads(row["metrics_json"])["rows"] == 16
    loaded = load_checkpoint(pool_lake, "agent", 1)
    assert loaded.model.config.hidden_size == 64

    # Everything in the pool has been trained on by v1: a second update has nothing new.
    with pytest.raises(TrainError, match="holds no rows to train the agent on since gold/d_train@"):
        train_update("agent", pool_lake, FAST_AGENT)
    # New rows arrive: v2 trains on them only, from v1.
    publish_epoch(broker.bootstrap, epoch=1, seed=1)
    ingest(pool_lake, broker.bootstrap, idle_exit_s=1.5)
    second = train_update("agent", pool_lake, FAST_AGENT)
    assert (second.version, second.parent_version, second.metrics["rows"]) == (2, 1, 16)

    # An env update waits for min_rows: the 8 rows stay in the pool, and the next update takes them all.
    with pytest.raises(TrainError, match="8 new rows to train the env on, fewer than min_rows 9: they wait"):
        train_update("env", pool_lake, RWRConfig(per_device_train_batch_size=4, min_rows=9), base_model="tiny")
    env = train_update("env", pool_lake, RWRConfig(per_device_train_batch_size=4, min_rows=8), base_model="tiny")
    assert (env.version, env.pool_table, env.metrics["rows"]) == (1, "gold/d_env", 8)


@pytest.mark.integration
def test_a_corrupt_checkpoint_is_refused_with_one_line(pool_lake, broker):
    record = train_update("agent", pool_lake, FAST_AGENT, base_model="tiny")
    publish_checkpoint(pool_lake, broker.bootstrap, record, run_id="t", epoch=0)
    weights = Path(pool_lake.root) / record.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(pool_lake, "agent", 1)
    assert "corrupt or replaced" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="no agent checkpoint version 5"):
        load_checkpoint(pool_lake, "agent", 5)


@pytest.mark.integration
def test_genenv_train_cli_trains_publishes_and_refuses_bad_input_with_one_line(pool_lake):
    root = pool_lake.root
    ok = genenv_cli(
        "train",
        "agent",
        "--lake",
        root,
        "--model",
        "tiny",
        "--set",
        "learning_rate=1e-3",
        "--set",
        "per_device_train_batch_size=8",
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert registry(pool_lake, "agent")["version"].to_list() == [1]

    def fails(*args: str) -> str:
        result = genenv_inline("train", *args, "--lake", root)
        assert result.returncode == 2, (args, result.stdout[-500:], result.stderr[-1000:])
        assert result.stderr.strip().count("\n") == 0, result.stderr
        return result.stderr

    before = sorted(p.name for p in (Path(root) / "checkpoints" / "agent").iterdir())
    assert "no rows to train the agent on" in fails("agent")  # the pool holds nothing v1 has not seen
    assert "has no version 999" in fails("agent", "--pool-version", "999")
    assert "unknown model 'no-such-model'" in fails("env", "--model", "no-such-model")
    assert "learning_rate" in fails("agent", "--set", "learning_rate=fast")
    assert "no such option" in fails("agent", "--set", "lr=1")
    assert "name the base model" in fails("env")
    assert "no agent checkpoint version 99" in fails("agent", "--parent", "99")
    assert sorted(p.name for p in (Path(root) / "checkpoints" / "agent").iterdir()) == before, "nothing written"
    assert not (Path(root) / "checkpoints" / "env").exists()


@pytest.mark.integration
def test_an_empty_pool_is_a_one_line_error(lake):
    with pytest.raises(TrainError) as info:
        train_update("agent", lake, FAST_AGENT, base_model="tiny")
    assert "gold/d_train@0 holds no rows" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.integration
def test_lora_updates_merge_into_a_plain_checkpoint(pool_lake):
    config = GRPOConfig(**{**FAST_AGENT.__dict__, "use_peft": True, "lora_r": 4, "lora_alpha": 8})
    record = train_update("agent", pool_lake, config, base_model="tiny")
    loaded = load_model(str(Path(pool_lake.root) / record.path))  # a plain transformers model: adapters folded in
    base = load_model("tiny")
    changed = [
        name
        for name, tensor in loaded.model.state_dict().items()
        if not __import__("torch").equal(tensor, base.model.state_dict()[name])
    ]
    assert changed and all("proj" in name for name in changed), changed


@pytest.mark.integration
@pytest.mark.parametrize("kind, use_peft", [("agent", False), ("agent", True), ("env", False)])
def test_a_mixed_precision_update_keeps_every_change_in_its_checkpoint(pool_lake, kind, use_peft):
    """bf16 compute over fp32 master weights (or fp32 adapters on a bf16 base): the checkpoint holds the fp32 weights
    trained, so the next update starts from them, changes below bf16's spacing included. A bf16 file kept only the
    changes that moved a weight across a bf16 rounding boundary: a small fraction of a small update's."""
    from safetensors import safe_open

    from trainers import Precision

    options = {"use_peft": True, "lora_r": 4, "lora_alpha": 8} if use_peft else {}
    if kind == "agent":
        config = GRPOConfig(**{**FAST_AGENT.__dict__, "learning_rate": 1e-5, **options})
    else:  # the simulator's RWR update, in the same precision
        config = RWRConfig(learning_rate=1e-5, per_device_train_batch_size=4)
    record = train_update(kind, pool_lake, config, base_model="tiny", precision=Precision("cpu", "bf16"))
    with safe_open(str(Path(pool_lake.root) / record.path / "model.safetensors"), "pt") as weights:
        assert {weights.get_slice(k).get_dtype() for k in weights.keys()} == {"F32"}
    trained = load_model(str(Path(pool_lake.root) / record.path)).model.state_dict()  # in fp32, as the next update
    # What the update started from: the base in fp32 (master weights), or in bf16 under LoRA's frozen base.
    base = load_model("tiny").model.state_dict()
    if use_peft:
        base = {name: tensor.bfloat16().float() for name, tensor in base.items()}
    moved = sum(int((trained[n] != base[n]).sum()) for n in base)
    kept_by_bf16 = sum(int((trained[n].bfloat16() != base[n].bfloat16()).sum()) for n in base)
    assert moved > 0 and kept_by_bf16 < moved / 2, (moved, kept_by_bf16)


@pytest.mark.integration
def test_updates_continue_one_optimiser_through_the_checkpoints(pool_lake, broker):
    """An update continues the AdamW state and schedule its parent's update saved beside the checkpoint (so a
    restarted trainer, a resume and a replay continue it too); from the base model it starts fresh."""
    import torch

    from trainers.checkpoints import load_optimizer_state

    config = GRPOConfig(
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        seed=7,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_steps=20,
        filter_groups=False,
    )  # 16 rows: 4 steps
    first = train_update("agent", pool_lake, config, base_model="tiny")
    assert first.metrics["optimizer"] == "fresh" and first.metrics["optimizer_steps"] == 4
    publish_checkpoint(pool_lake, broker.bootstrap, first, run_id="t", epoch=0)
    publish_epoch(broker.bootstrap, epoch=1, seed=1)
    ingest(pool_lake, broker.bootstrap, idle_exit_s=1.5)
    saved = load_optimizer_state(pool_lake, "agent", 1)
    assert saved.step == 4 and {int(s["step"]) for s in saved.optimizer["state"].values()} == {4}
    second = train_update("agent", pool_lake, config)
    assert second.metrics["optimizer"] == "continued at step 4" and second.metrics["lineage_steps"] == 8
    # linear warmup over 2 steps, then decay to 0 at step 20: the last step of the second update is step 8 (0-based 7)
    assert second.metrics["learning_rate"] == pytest.approx(1e-3 * (20 - 7) / (20 - 2), rel=1e-3)  # metrics: 6 places
    lineage = json.loads((Path(pool_lake.root) / second.path / "genenv.json").read_text())
    assert lineage["optimizer_step"] == 8 and lineage["metrics"]["optimizer"] == "continued at step 4"
    # A file that does not match its recorded hash is refused, not trained from.
    path = Path(pool_lake.root) / first.path / "optimizer.pt"
    torch.save({"optimizer": saved.optimizer, "step": 0}, path)
    with pytest.raises(CheckpointError, match="optimizer.pt is missing or does not match"):
        train_update("agent", pool_lake, config, parent_version=1)


@pytest.mark.integration
def test_a_manual_update_continues_the_options_of_the_update_it_extends(pool_lake, broker):
    """`genenv train` takes the trainer options of the nearest update in its parent's lineage (the run's clip range,
    gradient checkpointing, LoRA, temperature), --set on top; from the base model, the defaults."""
    from trainers import inherited_config

    assert inherited_config(pool_lake, "agent", 0) == (GRPOConfig(), None)
    config = GRPOConfig(**{**FAST_AGENT.__dict__, "epsilon_high": 0.31, "gradient_checkpointing": True})
    first = train_update("agent", pool_lake, config, base_model="tiny")
    publish_checkpoint(pool_lake, broker.bootstrap, first, run_id="t", epoch=0)
    publish_epoch(broker.bootstrap, epoch=1, seed=1)
    ingest(pool_lake, broker.bootstrap, idle_exit_s=1.5)
    assert inherited_config(pool_lake, "agent", 1) == (config, 1)
    second = genenv_cli(
        "train", "agent", "--lake", pool_lake.root, "--bootstrap", broker.bootstrap, "--set", "max_grad_norm=0.5"
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "options: those of agent v1's update, with --set" in second.stdout
    lineage = json.loads((Path(pool_lake.root) / "checkpoints" / "agent" / "v2" / "genenv.json").read_text())
    assert lineage["config"] == {**json.loads(json.dumps(config.__dict__)), "max_grad_norm": 0.5}


@pytest.mark.unit
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_decaying_schedule_stays_at_zero_past_max_steps(schedule):
    """A lineage that runs past max_steps (more updates than planned, a resumed run) trains no further, where
    transformers' cosine would climb back to the full learning rate over the next max_steps."""
    import torch

    from trainers.loop import OptimConfig, lr_schedule

    config = OptimConfig(learning_rate=1e-3, lr_scheduler_type=schedule, warmup_steps=2, max_steps=10)
    rates = {}
    for start in (5, 10, 15, 19):
        optimiser = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
        rates[start] = lr_schedule(optimiser, config, start).get_last_lr()[0]
    assert 0 < rates[5] < 1e-3 and rates[10] == rates[15] == rates[19] == 0.0, rates


@pytest.mark.unit
def test_a_step_is_the_mean_of_the_micro_batches_it_has():
    """Steps of gradient_accumulation_steps micro-batches, the last one of a pass taking what is left, each the
    mean over its own micro-batches: 4 micro-batches with accumulation 3 are steps of 3 and 1 in each pass."""
    import torch

    from trainers.loop import OptimConfig, OptimizerState, optimise

    model = torch.nn.Linear(1, 1, bias=False)  # loss w * 1: every micro-batch's gradient is exactly 1
    config = OptimConfig(learning_rate=1e-3, gradient_accumulation_steps=3, max_grad_norm=1e9)
    state = OptimizerState()
    metrics = optimise(
        model, [1.0] * 4, lambda x, m: [(m(torch.tensor([[x]])).sum(), {})], config, passes=2, state=state
    )
    assert metrics["optimizer_steps"] == 4 and state.step == 4 and metrics["lineage_steps"] == 4  # two per pass
    assert metrics["grad_norm"] == pytest.approx(1.0), "the one-micro-batch step is not divided by 3"
    assert {int(s["step"]) for s in state.optimizer["state"].values()} == {4}
