"""The seed warm start through TRL's SFTTrainer: supervised fine-tuning on the seed rows' completions only.

A warm start is plain supervised fine-tuning on (prompt, completion) rows, which is what TRL's SFTTrainer is, so it
is not written again here: SFTTrainer owns the optimiser, the schedule, the collator and the completion-only loss
(the mean negative log-likelihood of the completion tokens of a step). What this module adds is the bridge:

- The rows are tokenized as every other part of genenv tokenizes them (batching.supervised_ids: the prompt's ids
  as the chat template wrote them, no second BOS; the text with end-of-sequence) and handed to SFTTrainer already
  tokenized, with a completion mask. So the model learns the exact ids it later generates after and is scored on,
  and SFTTrainer's own text handling (chat templates, EOS appending, truncation) never runs.
- The options are the RWRConfig a warm start has always recorded in its lineage (TrainingArguments' names, so
  they map one to one: learning rate, micro-batch size, accumulation, passes, schedule, clipping, seed, activation
  checkpointing; `freeze_embeddings` leaves the embeddings out of the optimiser), and the compute dtype is the
  update's (autocast over fp32 master weights, as the other trainers, without autocast's cache of weight copies).
- Its optimiser is dropped with it: a warm start's objective is not the next update's (trainers/update.py
  `starting_optimizer`), and SFTTrainer writes nothing to disk (save_strategy "no", in a temporary output_dir);
  the checkpoint with its lineage is written by trainers/update.py as for every update.

Deterministic on CPU for the same model, rows, options and seed (SFTTrainer draws the rows' order from `seed`):
`genenv replay` of epoch 0 retrains the warm start bit for bit.
"""

from __future__ import annotations

import tempfile

import polars as pl

from .batching import supervised_ids
from .heap import release_free_heap
from .loop import Progress
from .models import Precision
from .rwr import RWRConfig


def completion_rows(tokenizer, rows: pl.DataFrame):
    """The rows as a tokenized datasets.Dataset: input_ids (prompt then completion) and completion_mask (1 on the
    completion's tokens, which are all the loss sees)."""
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()  # a bar per map over a few dozen rows is noise in the run's output
    prompts, completions = supervised_ids(tokenizer, rows["prompt"].to_list(), rows["text"].to_list())
    return Dataset.from_dict(
        {
            "input_ids": [p + c for p, c in zip(prompts, completions)],
            "completion_mask": [[0] * len(p) + [1] * len(c) for p, c in zip(prompts, completions)],
        }
    )


def sft_arguments(config: RWRConfig, precision: Precision, output_dir: str):
    """TRL's SFTConfig for a warm start with these options, computing in the update's precision."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_train_epochs=config.num_train_epochs,
        lr_scheduler_type=config.schedule,
        warmup_steps=config.warmup,
        max_grad_norm=config.max_grad_norm,
        weight_decay=config.weight_decay,
        optim="adamw_torch_fused",  # one kernel on CUDA and on the CPU (trainers/loop.py `optimise` says why)
        seed=config.seed,
        data_seed=config.seed,
        activation_checkpointing=config.gradient_checkpointing,  # transformers' name for it since 5.x
        bf16=precision.dtype == "bf16",
        fp16=precision.dtype == "fp16",
        use_cpu=precision.device == "cpu",
        completion_only_loss=True,
        max_length=None,  # the rows are whole prompts and answers: never truncated
        packing=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,  # every step's loss and grad norm, for the metrics below
        disable_tqdm=True,  # progress goes to the engine's own display (`progress`)
        dataloader_num_workers=0,
    )


def completion_sft_trainer():
    """TRL's SFTTrainer, its loss taken at the completion positions only. Its own fused head scores every position
    of every row off Triton devices (a CPU), and a simulator's prompt (four candidates' tools) is ten times as
    long as the request it writes: the warm start's minutes were the prompts' vocabulary projections. The loss is
    SFTTrainer's own (`nll`: the summed negative log-likelihood of a step's completion tokens over their number,
    tests/test_trainers.py holds the two equal); the backbone runs once, the head only where a label is."""
    import torch
    from accelerate.utils import AutocastKwargs
    from trl import SFTTrainer

    UNCACHED = AutocastKwargs(cache_enabled=False)  # no second copy of the weights (trainers/update.py `fit`)

    class CompletionSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            with self.accelerator.autocast(autocast_handler=UNCACHED):
                hidden = model.get_decoder()(
                    input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False
                ).last_hidden_state[:, :-1]
                labels = inputs["labels"][:, 1:]
                scored = labels != -100
                logits = model.get_output_embeddings()(hidden[scored]).float()
            tokens = scored.sum() if num_items_in_batch is None else num_items_in_batch
            nll = torch.nn.functional.cross_entropy(logits, labels[scored], reduction="sum")
            loss = nll / torch.as_tensor(tokens, device=nll.device).clamp(min=1)
            return (loss, None) if return_outputs else loss

    return CompletionSFTTrainer


def train_sft(
    model, tokenizer, rows: pl.DataFrame, config: RWRConfig, precision: Precision, progress: Progress | None = None
) -> dict:
    """Fine-tune `model` in place on rows of (prompt, text) through TRL's SFTTrainer; its metrics as the other
    trainers report them (mean loss, optimiser steps, the last learning rate and grad norm, rows)."""
    from transformers import PrinterCallback, TrainerCallback

    class Steps(TrainerCallback):
        """Progress at each step; the heap a micro-batch freed given back after it (trainers/heap.py)."""

        def on_substep_end(self, args, state, control, **kwargs):
            release_free_heap()

        def on_step_end(self, args, state, control, **kwargs):
            release_free_heap()
            if progress:
                progress(state.global_step, state.max_steps)

    use_cache = model.config.use_cache  # SFTTrainer turns the cache off, and the checkpoint would keep it off
    if config.freeze_embeddings:  # SFTTrainer's optimiser takes only the weights that require gradients
        model.get_input_embeddings().weight.requires_grad_(False)
    with tempfile.TemporaryDirectory(prefix="genenv-sft-") as output_dir:
        trainer = completion_sft_trainer()(
            model=model,
            args=sft_arguments(config, precision, output_dir),
            train_dataset=completion_rows(tokenizer, rows),
            processing_class=tokenizer,
            callbacks=[Steps()],
        )
        trainer.remove_callback(PrinterCallback)  # it prints every step's log line to stdout
        result = trainer.train()
    model.config.use_cache = use_cache
    model.eval()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {
        "loss": sum(entry["loss"] for entry in steps) / max(len(steps), 1),
        "optimizer_steps": result.global_step,
        "lineage_steps": result.global_step,
        "learning_rate": steps[-1].get("learning_rate", 0.0) if steps else 0.0,
        "grad_norm": float(steps[-1].get("grad_norm", 0.0)) if steps else 0.0,
        "rows": rows.height,
        "trainer": "trl.SFTTrainer",
    }
