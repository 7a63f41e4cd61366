"""Token batches for training: prompt + completion, laid out so every completion starts in one column.

    [pad pad p p p | c c c pad]      prompts left-padded, completions right-padded
    [pad p p p p   | c c pad pad]

With that layout the completion tokens of every row sit in columns [P, P + C), so the
model's logits are needed only for the last C + 1 positions (`logits_to_keep`) and the
log-probability of each completion token comes from one slice, not a per-row gather.
Position ids follow the attention mask, as they do during batched generation, so the
recomputed log-probabilities equal the ones recorded at rollout time.

A GRPO group is G completions of one prompt. `pack_shared` keeps each distinct prompt once
and `completion_logps` then runs the shared-prefix forward of Prefix Grouper (arXiv
2506.05433): the prompts are encoded once, their keys and values are indexed out to the rows
that share them, and the completions attend to them. The indexing is differentiable, so
gradients flow through the shared prefix exactly as through G copies of it: the same
log-probabilities and gradients as the packed forward (to float rounding; tests/test_trainers.py),
with the prompt's tokens computed once per group instead of G times. transformers has the
pieces (a forward that returns its key/value cache, and one that continues from a cache) but
not this use of them for training, hence this module. A model that recomputes activations in
the backward pass (gradient checkpointing) returns no cache; its rows are packed instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .generation import CACHE, prompt_token_ids


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # (batch, P + C)
    attention_mask: torch.Tensor  # (batch, P + C)
    completion_ids: torch.Tensor  # (batch, C), padded with 0
    completion_mask: torch.Tensor  # (batch, C), 1 on real completion tokens

    @property
    def completion_width(self) -> int:
        return self.completion_ids.shape[1]


def supervised_ids(tokenizer, prompts: list[str], texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of (prompt, text) rows for a supervised loss (RWR, the warm start, GRPO's ptx term): the texts end
    with end-of-sequence, so the model learns where to stop."""
    prompt_ids = prompt_token_ids(tokenizer, prompts)
    text_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return prompt_ids, [ids + [tokenizer.eos_token_id] for ids in text_ids]


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


@dataclass
class SharedPrefixBatch:
    """Rows that share prompts: each distinct prompt once, left-padded, and for each row the index of its prompt."""

    prompt_ids: torch.Tensor  # (prompts, P)
    prompt_mask: torch.Tensor  # (prompts, P)
    prompt_of_row: torch.Tensor  # (batch,)
    completion_ids: torch.Tensor  # (batch, C), padded with 0
    completion_mask: torch.Tensor  # (batch, C), 1 on real completion tokens
    pad_id: int

    @property
    def completion_width(self) -> int:
        return self.completion_ids.shape[1]

    def packed(self) -> TokenBatch:
        """The same rows as one packed batch, every prompt repeated for each of its rows."""
        prompt_ids, prompt_mask = self.prompt_ids[self.prompt_of_row], self.prompt_mask[self.prompt_of_row]
        completion_pad = torch.where(self.completion_mask.bool(), self.completion_ids, self.pad_id)
        return TokenBatch(
            torch.cat([prompt_ids, completion_pad], dim=1),
            torch.cat([prompt_mask, self.completion_mask], dim=1),
            self.completion_ids,
            self.completion_mask,
        )


def pack_shared(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int) -> SharedPrefixBatch:
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError("pack_shared needs one completion per prompt and at least one row")
    distinct = list(dict.fromkeys(tuple(p) for p in prompt_ids))
    index = {p: i for i, p in enumerate(distinct)}
    P = max(len(p) for p in distinct)
    C = max(1, max(len(c) for c in completion_ids))
    return SharedPrefixBatch(
        torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in distinct]),
        torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in distinct]),
        torch.tensor([index[tuple(p)] for p in prompt_ids]),
        torch.tensor([list(c) + [0] * (C - len(c)) for c in completion_ids]),
        torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in completion_ids]),
        pad_id,
    )


def completion_logps(model, batch: TokenBatch | SharedPrefixBatch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(c_t | prompt, c_<t) for every completion token, (batch, C); padding positions hold junk (mask them).
    A SharedPrefixBatch runs the shared-prefix forward (see the module's docstring)."""
    if isinstance(batch, SharedPrefixBatch):
        if checkpointed(model):
            return completion_logps(model, batch.packed(), temperature)
        return shared_prefix_logps(model, batch, temperature)
    C = batch.completion_width
    device = next(model.parameters()).device
    mask = batch.attention_mask.to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=mask,
        position_ids=position_ids,
        logits_to_keep=C + 1,
        use_cache=False,
    ).logits[:, :-1]
    return chosen_logps(logits, batch.completion_ids.to(device), temperature)


def checkpointed(model) -> bool:
    """Whether the model recomputes activations in the backward pass (and so keeps no key/value cache). Asked of
    the model inside DDP's wrapper, which does not pass the attribute through (it read False under DDP)."""
    model = getattr(model, "module", model)
    name = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    return bool(getattr(model, name, False))


def select_rows(cache, rows: torch.Tensor, prompts: int) -> None:
    """Each row's prompt keys and values in the cache (what `cache.batch_select_indices(rows)` does), as a product
    with a one-hot matrix. Indexing's backward adds the rows' gradients into their shared prompt with index_add,
    whose order of additions on the CPU changes from run to run once the tensors are large (a 135M model's are):
    the weights would then differ in the last bit between a run and its replay. A matrix product's reduction
    does not change, and multiplying by one and adding zeros leaves the forward exact."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # older transformers: lists of tensors per layer, indexed as before
        cache.batch_select_indices(rows)
        return
    for layer in layers:
        layer.keys, layer.values = pick_rows(layer.keys, rows, prompts), pick_rows(layer.values, rows, prompts)


def pick_rows(tensor: torch.Tensor, rows: torch.Tensor, prompts: int) -> torch.Tensor:
    """tensor[rows] as a product with a one-hot matrix: the same values, and a backward that adds the rows sharing a
    prompt in a fixed order (see `select_rows`)."""
    return torch.einsum("rp,p...->r...", torch.nn.functional.one_hot(rows, prompts).to(tensor.dtype), tensor)


def shared_prefix_logps(model, batch: SharedPrefixBatch, temperature: float = 1.0) -> torch.Tensor:
    """completion_logps with each distinct prompt encoded once (the shared-prefix forward)."""
    device = next(model.parameters()).device
    prompt_mask, rows = batch.prompt_mask.to(device), batch.prompt_of_row.to(device)
    encoded = model(
        input_ids=batch.prompt_ids.to(device),
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(encoded, CACHE)
    select_rows(cache, rows, batch.prompt_ids.shape[0])  # each row's prompt keys and values: gradients reach the prompt
    completion_mask = batch.completion_mask.to(device)
    C = batch.completion_width
    # Each completion continues its prompt's positions; it attends to its own prompt (padding masked) and itself.
    positions = prompt_mask.sum(-1)[rows].unsqueeze(1) + torch.arange(C, device=device)
    continued = model(
        input_ids=batch.completion_ids.to(device),
        attention_mask=torch.cat([prompt_mask[rows], completion_mask], dim=1),
        position_ids=positions,
        use_cache=True,
        **{CACHE: cache},
    )
    # The first completion token is predicted at the prompt's last position, the others inside the completion.
    first = pick_rows(encoded.logits[:, -1:], rows, batch.prompt_ids.shape[0])  # not [rows]: see `select_rows`
    logits = torch.cat([first, continued.logits[:, :-1]], dim=1)
    return chosen_logps(logits, batch.completion_ids.to(device), temperature)


def chosen_logps(logits: torch.Tensor, chosen_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) at the chosen tokens, without materialising the whole log-softmax tensor twice;
    in float32 at least (logits of a bf16 model are upcast, never those of a float64 one down)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, chosen_ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
