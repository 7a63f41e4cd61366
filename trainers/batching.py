"""Token batches for training: prompt + completion, laid out so every completion starts in one column.

    [pad pad p p p | c c c pad]      prompts left-padded, completions right-padded
    [pad p p p p   | c c pad pad]

With that layout the completion tokens of every row sit in columns [P, P + C), so the
model's logits are needed only for the last C + 1 positions (`logits_to_keep`) and the
log-probability of each completion token comes from one slice, not a per-row gather.
Position ids follow the attention mask, as they do during batched generation, so the
recomputed log-probabilities equal the ones recorded at rollout time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # (batch, P + C)
    attention_mask: torch.Tensor  # (batch, P + C)
    completion_ids: torch.Tensor  # (batch, C), padded with 0
    completion_mask: torch.Tensor  # (batch, C), 1 on real completion tokens

    @property
    def completion_width(self) -> int:
        return self.completion_ids.shape[1]


def pack(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int) -> TokenBatch:
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError("pack needs one completion per prompt and at least one row")
    P = max(len(p) for p in prompt_ids)
    C = max(1, max(len(c) for c in completion_ids))
    rows, masks, comps, comp_masks = [], [], [], []
    for p, c in zip(prompt_ids, completion_ids):
        left, right = P - len(p), C - len(c)
        rows.append([pad_id] * left + list(p) + list(c) + [pad_id] * right)
        masks.append([0] * left + [1] * (len(p) + len(c)) + [0] * right)
        comps.append(list(c) + [0] * right)
        comp_masks.append([1] * len(c) + [0] * right)
    return TokenBatch(torch.tensor(rows), torch.tensor(masks), torch.tensor(comps), torch.tensor(comp_masks))


def completion_logps(model, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(c_t | prompt, c_<t) for every completion token, (batch, C); padding positions hold junk (mask them)."""
    C = batch.completion_width
    device = next(model.parameters()).device
    mask = batch.attention_mask.to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids.to(device), attention_mask=mask, position_ids=position_ids,
                   logits_to_keep=C + 1, use_cache=False).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    # log_softmax at the chosen token without materialising the whole log-softmax tensor twice.
    chosen = logits.gather(-1, batch.completion_ids.to(device).unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
