"""Token batches for training: prompt + completion, laid out so every completion starts in one column.

    [pad pad p p p | c c c pad]      prompts left-padded, completions right-padded
    [pad p p p p   | c c pad pad]

With that layout the completion tokens of every row sit in columns [P, P + C), so the
model's logits are needed only for the last C + 1 positions (`logits_to_keep`) and the
log-probability of each completion token comes from one slice, not a per-row gather.
Position ids follow the attention mask, as they do during batched generation, so the
recomputed log-probabilities equal the ones recorded at rollout time.

A GRPO group is G completions of one prompt. `pack_shared` keeps each distinct prompt once
and `completion_logps` then runs a shared-prefix forward (Prefix Grouper, arXiv 2506.05433, in the layout of
tree attention): one sequence per prompt, the prompt followed by its rows' completions side by side, under a
4D attention mask by which each completion sees its prompt and itself (`PrefixTree`). The prompt's tokens are
computed once per group instead of G times, and gradients reach them from every row: the same
log-probabilities and gradients as the packed forward (to float rounding; tests/test_batching.py). It is one
plain forward, so it runs with activations recomputed in the backward pass (gradient checkpointing) as well.
transformers passes a 4D mask to the attention as it is but has no layout that uses one for training, hence
this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from .generation import prompt_token_ids


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


@dataclass
class PrefixTree:
    """A SharedPrefixBatch laid out for one forward: a sequence per distinct prompt, its rows' completions after it
    side by side, in slots of C columns.

        [pad p p p | c1 c1 c1 pad | c2 c2 pad pad]     slot of row 1, slot of row 2

    Each completion attends to its prompt and to itself, never to its neighbours (`attention`), and continues its
    prompt's positions, so each of its tokens sees what it saw in the packed layout."""

    input_ids: torch.Tensor  # (prompts, P + K * C)
    position_ids: torch.Tensor  # (prompts, P + K * C)
    attention: torch.Tensor  # (prompts, 1, L, L), True where a query (row) may attend to a key (column)
    slot_of_row: torch.Tensor  # (batch,): which of its prompt's slots holds the row's completion
    prompt_width: int  # P


def prefix_tree(batch: SharedPrefixBatch) -> PrefixTree:
    prompts, P = batch.prompt_ids.shape
    C, rows = batch.completion_width, batch.prompt_of_row
    taken: dict[int, int] = {}
    slots = []
    for prompt in rows.tolist():  # the rows of a prompt fill its slots in their order
        slots.append(taken.get(prompt, 0))
        taken[prompt] = slots[-1] + 1
    slot_of_row, K = torch.tensor(slots), max(taken.values())
    L = P + K * C
    input_ids = torch.full((prompts, L), batch.pad_id, dtype=batch.prompt_ids.dtype)
    real = torch.zeros((prompts, L), dtype=torch.bool)  # the keys that are tokens, not padding
    input_ids[:, :P], real[:, :P] = batch.prompt_ids, batch.prompt_mask.bool()
    completion = torch.where(batch.completion_mask.bool(), batch.completion_ids, batch.pad_id)
    columns = P + slot_of_row.unsqueeze(1) * C + torch.arange(C)  # (batch, C): where each row's tokens go
    input_ids[rows.unsqueeze(1), columns] = completion.to(input_ids.dtype)
    real[rows.unsqueeze(1), columns] = batch.completion_mask.bool()
    position_ids = torch.zeros((prompts, L), dtype=torch.long)
    position_ids[:, :P] = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    position_ids[:, P:] = batch.prompt_mask.sum(-1, keepdim=True) + torch.arange(C).repeat(K)
    segment = torch.cat([torch.full((P,), -1), torch.arange(K).repeat_interleave(C)])  # -1: the prompt
    index = torch.arange(L)
    sees = (index.unsqueeze(0) <= index.unsqueeze(1)) & (
        (segment.unsqueeze(0) == -1) | (segment.unsqueeze(0) == segment.unsqueeze(1))
    )  # (query, key): earlier or itself, in the prompt or in the query's own slot
    # Every query sees itself, padding too: a softmax over no key would be NaN, and NaN times a zero gradient is NaN.
    attention = (sees.unsqueeze(0) & real.unsqueeze(1)) | torch.eye(L, dtype=torch.bool)
    return PrefixTree(input_ids, position_ids, attention.unsqueeze(1), slot_of_row, P)


def shared_prefix_logps(model, batch: SharedPrefixBatch, temperature: float = 1.0) -> torch.Tensor:
    """completion_logps with each distinct prompt encoded once (the shared-prefix forward): one forward of the
    PrefixTree layout, under a 4D mask transformers passes to the attention as it is. A plain forward, so it
    also runs with activations recomputed in the backward pass (gradient checkpointing), which a forward that
    continues from a key/value cache cannot: transformers turns the cache off there."""
    attention_kind = getattr(model, "module", model).config._attn_implementation  # through DDP's wrapper
    if attention_kind not in ("sdpa", "eager"):  # flash attention takes no 4D mask: the prompt once per row, then
        return completion_logps(model, batch.packed(), temperature)
    device = next(model.parameters()).device
    tree = prefix_tree(batch)
    attention = tree.attention.to(device)
    if attention_kind == "eager":
        # eager attention adds the mask to the scores: it takes 0 where allowed and the dtype's minimum elsewhere
        dtype = next(model.parameters()).dtype
        attention = torch.zeros(attention.shape, dtype=dtype, device=device).masked_fill(
            ~attention, torch.finfo(dtype).min
        )
    C, P, prompts = batch.completion_width, tree.prompt_width, batch.prompt_ids.shape[0]
    logits = model(
        input_ids=tree.input_ids.to(device),
        attention_mask=attention,
        position_ids=tree.position_ids.to(device),
        logits_to_keep=tree.input_ids.shape[1] - P + 1,  # the prompt's last position, then every slot
        use_cache=False,
    ).logits
    rows, slots = batch.prompt_of_row.to(device), tree.slot_of_row.to(device)
    completion_ids = batch.completion_ids.to(device)
    # A row's first token is predicted at its prompt's last position, which its group shares: taken as a product
    # with a one-hot matrix (`pick_rows`), not by indexing, whose backward would add the rows in a varying order.
    first = pick_rows(logits[:, :1].clone(), rows, prompts)  # a copy: a view would keep all the logits alive
    # The others inside its own slot: (prompt, slot) pairs are distinct, so indexing is exact both ways.
    within = logits[:, 1:].unflatten(1, (-1, C))[rows, slots, : C - 1]
    del logits  # each token's log-probability is taken apart (no concatenated copy of the logits)
    first_logps = chosen_logps(first, completion_ids[:, :1], temperature)
    return torch.cat([first_logps, chosen_logps(within, completion_ids[:, 1:], temperature)], dim=1)


def pick_rows(tensor: torch.Tensor, rows: torch.Tensor, prompts: int) -> torch.Tensor:
    """tensor[rows] as a product with a one-hot matrix: the same values, and a backward that adds the rows sharing a
    prompt in a fixed order. Indexing's backward adds them with index_add, whose order on the CPU changes from
    run to run once the tensors are large (a 135M model's are): the weights would then differ in the last bit
    between a run and its replay. A matrix product's reduction does not change, and multiplying by one and
    adding zeros leaves the forward exact."""
    return torch.einsum("rp,p...->r...", torch.nn.functional.one_hot(rows, prompts).to(tensor.dtype), tensor)


def chosen_logps(logits: torch.Tensor, chosen_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) at the chosen tokens, in float32 at least (logits of a bf16 model are upcast, never
    those of a float64 one down). Where a backward pass will follow, one row at a time with the float32 work
    recomputed in the backward pass (torch's checkpoint): the backward then keeps only the model's own logits, not
    their float32 copy, and its float32 gradients exist for one row at a time. Each token's figure is computed by
    the same operations as in one piece, so the values and gradients are the same bits. At 8 rows of 72 tokens
    and a 49k vocabulary each float32 copy is 113 MB, and the one-piece backward held several at once."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return _chosen_logps(logits, chosen_ids, temperature)
    return torch.cat(
        [
            checkpoint(_chosen_logps, row, ids, temperature, use_reentrant=False)
            for row, ids in zip(logits.split(1), chosen_ids.split(1))
        ]
    )


def _chosen_logps(logits: torch.Tensor, chosen_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, chosen_ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
