"""Our GRPO loss (trainers/losses.py) against TRL's: the same model, rows, old, reference and sampler log-probabilities
given to a TRL GRPOTrainer's own loss (`_compute_loss`, what its `compute_loss` calls) and to ours, for each loss
type ours offers, with the options that change the formula. TRL is the reference implementation: trainers/grpo.py
says why the update loop is ours and the loss must still be TRL's."""

from __future__ import annotations

import tempfile

import pytest
import torch

from trainers import GRPOConfig, load_model
from trainers.batching import completion_logps, pack
from trainers.losses import grpo_loss

OPTIONS = {
    "plain": {},
    "clip-higher and KL": {"epsilon_high": 0.28, "beta": 0.04},
    "KL without bias correction": {"beta": 0.04, "use_bias_correction_kl": False},
    "sequence ratio": {"importance_sampling_level": "sequence"},
    "sampler correction": {"importance_sampling_cap": 2.0},
}


def trl_trainer(model, tokenizer, loss_type: str, options: dict, completion_width: int):
    """A TRL GRPOTrainer over `model` with the options given (with beta > 0 it loads its reference model from the
    model's folder: the tiny model is saved for it; the test hands it the reference log-probabilities)."""
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = folder
    args = TRLConfig(
        output_dir=folder,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=completion_width,
        loss_type=loss_type,
        beta=options.get("beta", 0.0),
        epsilon=0.2,
        epsilon_high=options.get("epsilon_high", 0.2),
        importance_sampling_level=options.get("importance_sampling_level", "token"),
        use_bias_correction_kl=options.get("use_bias_correction_kl", True),
        report_to=[],
        use_cpu=True,
    )

    class SameLogProbabilities(TRLTrainer):
        """TRL's trainer, its loss fed the per-token log-probabilities ours takes (TRL computes them with a fused
        LM head whose results differ from a plain forward's by ~1e-3: the loss is what is compared)."""

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            return self.logps, torch.zeros_like(self.logps), None

    trainer = SameLogProbabilities(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["unused"]}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop; one micro-batch a step here
    # Its vLLM path is where the sampler's log-probabilities weight the loss (vllm_importance_sampling_correction).
    trainer.use_vllm = "importance_sampling_cap" in options
    trainer.vllm_importance_sampling_correction = trainer.use_vllm
    return trainer


@pytest.mark.unit
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("case", list(OPTIONS))
def test_our_grpo_loss_equals_trls_on_the_same_rows(loss_type, case):
    options = OPTIONS[case]
    tiny = load_model("tiny", seed=0)
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, 200, (4, 6), generator=generator)  # one prompt length: no left padding to align
    lengths = [7, 5, 3, 7]
    completions = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in lengths]
    batch = pack(prompts.tolist(), completions, tiny.tokenizer.pad_token_id)
    width = batch.completion_width
    mask = batch.completion_mask
    with torch.no_grad():
        logps = completion_logps(tiny.model, batch)
    noise = lambda scale: scale * torch.randn(logps.shape, generator=generator)  # noqa: E731
    old = (logps + noise(0.3)) * mask  # ratios away from 1, some clipped
    ref = (logps + noise(0.2)) * mask
    sampler = old + noise(0.5)
    advantages = torch.tensor([1.2, -0.4, 0.7, -1.5])
    weights = torch.exp(old - sampler).clamp(max=options.get("importance_sampling_cap", 2.0))

    trainer = trl_trainer(tiny.model, tiny.tokenizer, loss_type, options, width)
    inputs = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": batch.completion_ids,
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "importance_sampling_ratio": weights,
        "num_items_in_batch": mask.sum(),  # dapo's normaliser: the step's completion tokens
    }
    tiny.model.train()
    current = completion_logps(tiny.model, batch)
    trainer.logps = current
    theirs = trainer._compute_loss(tiny.model, inputs)
    config = GRPOConfig(
        loss_type=loss_type,
        epsilon=0.2,
        epsilon_high=options.get("epsilon_high"),
        beta=options.get("beta", 0.0),
        importance_sampling_level=options.get("importance_sampling_level", "token"),
        use_bias_correction_kl=options.get("use_bias_correction_kl", True),
        max_completion_length=width,
    )
    ours, _ = grpo_loss(
        current,
        old,
        advantages,
        mask,
        config,
        ref,
        weights if "importance_sampling_cap" in options else None,
    )
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0), (ours.item(), theirs.item())
