"""Generation behind one interface: text, token ids and the log-probability of every sampled token.

`TransformersBackend` batches prompts with transformers' models and KV cache, and decodes them with a loop of its
own (`TransformersBackend.decode`): transformers' `generate` runs every row of a batch until its longest answer
ends, and on a CPU a decoding step costs mostly the weights read once, so rows that have ended leave the batch.
What the prompts of a batch share (the chat template's start, a task's repeated prompt) is encoded once
(`TransformersBackend.prefill`). The log-probabilities are those of the policy the trainer optimises:
log_softmax(logits / T) at each sampled token (T = the sampling temperature, 1 for greedy), which is what a
teacher-forced forward pass of prompt + completion recomputes; top-p only narrows which tokens are sampled.
`VLLMBackend` is imported only where CUDA and vllm exist.

Every prompt is sampled with a seed of its own (`sample_seed`: from the run's seed and what names the
sample, such as the task id and the rollout index), so a task's G rollouts differ from each other,
the same run seed gives the same seeds on a replay, and a sample does not depend on which prompts
were batched with it. vLLM takes one SamplingParams (with its seed) per prompt; the transformers backend
draws each row's token with the row's own generator (`draw`: the Gumbel-max trick, argmax(logits / T + Gumbel
noise) is a sample of softmax(logits / T)).

A prompt may come with a grammar (EBNF, xgrammar's dialect): its tokens are then masked to what the grammar
allows, by xgrammar's grammar matcher (or vLLM's structured outputs, whose default backend is xgrammar too), so
both backends read one grammar. The log-probabilities recorded stay the model's own, unmasked: the trainers
recompute those.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

# transformers 5 names the key/value cache `cache` (argument and output); earlier versions `past_key_values`.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generation:
    prompt: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # completion tokens, the end-of-sequence token included when produced
    logprobs: list[float]  # one per completion token


def sample_seed(*parts) -> int:
    """A seed for one sample from the parts that name it, e.g. (run seed, task id, rollout index): distinct parts give
    distinct seeds (a 63-bit hash), and the same parts the same seed on every machine and replay."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def prompt_seeds(sampling: SamplingConfig, n: int, seeds: list[int] | None) -> list[int]:
    """One seed per prompt: the ones given, else derived from the sampling seed and the prompt's index."""
    if seeds is None:
        return [sample_seed(sampling.seed, i) for i in range(n)]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} prompts")
    return list(seeds)


def draw(scores: torch.Tensor, temperature: float, top_p: float, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row, sampled from softmax(scores / T) restricted to the top-p nucleus with the row's own
    generator, by Gumbel-max (argmax(logits / T + Gumbel noise) is a sample of softmax(logits / T)). A row's draw
    depends only on its scores and its generator, never on the rows beside it."""
    logits = scores.float() / temperature
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        outside = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1) >= top_p  # the first token always stays
        logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside), float("-inf"))
    uniform = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in generators]).to(logits.device)
    gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1 - 1e-7)))
    return (logits + gumbel).argmax(-1)


def render_prompt(tokenizer, user_text: str, system: str | None = None) -> str:
    """The prompt string the model sees: its chat template where it has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_text}
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (system + "\n\n" if system else "") + user_text


def prompt_token_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """The prompts' token ids as every component uses them (both generation backends, the trainers): the chat
    template already wrote any BOS the model wants, so the tokenizer adds no special token. A tokenizer left to add
    them (vLLM given a string does) puts a second BOS before the template's."""
    return tokenizer(prompts, add_special_tokens=False)["input_ids"]


@functools.lru_cache(maxsize=4)
def grammar_compiler(tokenizer, vocab_size: int):
    """xgrammar's compiler for a tokenizer (one per tokenizer and vocabulary size: building it reads the vocabulary)."""
    try:
        import xgrammar
    except ImportError:
        raise RuntimeError(
            "constrained generation needs xgrammar: pip install --no-deps xgrammar apache-tvm-ffi "
            "(the Makefile installs both)"
        ) from None
    return xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))


class TransformersBackend:
    def __init__(self, model, tokenizer, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        sampling: SamplingConfig | None = None,
        seeds: list[int] | None = None,
        progress=None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        """seeds: one per prompt (see `sample_seed`). progress(done, total), if given, is called after every batch
        with the prompts done so far. grammars: one EBNF grammar per prompt ("": unconstrained)."""
        sampling = sampling or SamplingConfig()
        seeds = prompt_seeds(sampling, len(prompts), seeds)
        grammars = grammars or [""] * len(prompts)
        # Batches of prompts of similar length: less padding, and answers that tend to end together (a row that has
        # ended rides along until a quarter of the batch has: `decode`). Each sample depends only on its prompt and
        # seed, so the order changes no result.
        lengths = [len(ids) for ids in prompt_token_ids(self.tokenizer, prompts)]
        order = sorted(range(len(prompts)), key=lengths.__getitem__)
        out: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(prompts), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, generation in zip(
                chunk,
                self._generate_batch(
                    [prompts[i] for i in chunk], sampling, [seeds[i] for i in chunk], [grammars[i] for i in chunk]
                ),
            ):
                out[i] = generation
            if progress:
                progress(min(start + self.batch_size, len(prompts)), len(prompts))
        return out

    def matchers(self, grammars: list[str]) -> list:
        """xgrammar's matcher for each row with a grammar (None for a free row)."""
        if not any(grammars):
            return [None] * len(grammars)
        import xgrammar

        compiler = grammar_compiler(self.tokenizer, self.model.config.vocab_size)
        return [xgrammar.GrammarMatcher(compiler.compile_grammar(g)) if g else None for g in grammars]

    @torch.no_grad()
    def prefill(self, enc) -> tuple[dict, dict]:
        """`decode`'s inputs and starting cache for a batch, with what its prompts share encoded once: the tokens
        every prompt starts with (the chat template's system turn and the domain's preamble: a fifth of a held-out
        prompt's tokens, two fifths of a simulator's) as one row, and each distinct prompt's rest once, its keys
        and values copied to the rows that repeat it (a task's group_size rollouts), as `pack_shared` does for
        training (trainers/batching.py). Prefill is most of a batch's time on a CPU: encoding every row whole was G
        times the work for G rollouts of a task, and the shared start once a row.
        The rows are laid out [shared start | left padding | rest], the attention mask zero on the padding, and
        positions follow the mask; the last prompt token is left out of the cache, for the first decoding step to run
        on. The inputs unchanged and no cache ({}) when nothing is shared."""
        pad = self.tokenizer.pad_token_id
        prompts = [row[keep].tolist() for row, keep in zip(enc["input_ids"], enc["attention_mask"].bool())]
        slot: dict[tuple, int] = {}  # a prompt -> its place among the distinct ones
        for prompt in prompts:
            slot.setdefault(tuple(prompt), len(slot))
        distinct = [list(p) for p in slot]
        # The shared start leaves every prompt at least its last token (the first decoding step's).
        shared = min(len(os.path.commonprefix(distinct)), min(map(len, distinct)) - 1)
        if shared < 1 and (len(distinct) == len(prompts) or min(map(len, distinct)) < 2):
            return enc, {}  # nothing shared (or a one-token prompt that no start could precede)
        rests = [p[shared:] for p in distinct]
        width = max(map(len, rests))
        ids = torch.tensor([distinct[0][:shared] + [pad] * (width - len(r)) + r for r in rests])
        mask = torch.tensor([[1] * shared + [0] * (width - len(r)) + [1] * len(r) for r in rests])
        device = self.model.device
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if shared:
            cache = getattr(self.model(input_ids=ids[:1, :shared], use_cache=True, logits_to_keep=1), CACHE)
            cache.batch_repeat_interleave(len(distinct))
        if width > 1:  # each distinct prompt's rest but its last token, after the shared start
            encoded = self.model(
                input_ids=ids[:, shared:-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, shared:-1],
                use_cache=True,
                logits_to_keep=1,
                **({CACHE: cache} if cache is not None else {}),
            )
            cache = getattr(encoded, CACHE)
        rows = torch.tensor([slot[tuple(p)] for p in prompts], device=device)
        cache.batch_select_indices(rows)
        return {"input_ids": ids[rows], "attention_mask": mask[rows]}, {CACHE: cache}

    def _generate_batch(
        self, prompts: list[str], sampling: SamplingConfig, seeds: list[int], grammars: list[str]
    ) -> list[Generation]:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
        was_training = self.model.training
        self.model.eval()
        answers = self.decode(enc, sampling, seeds, grammars)
        self.model.train(was_training)
        return [
            Generation(
                prompt=prompt,
                prompt_token_ids=row[keep].tolist(),
                text=tok.decode(ids, skip_special_tokens=True),
                token_ids=ids,
                logprobs=logprobs,
            )
            for prompt, row, keep, (ids, logprobs) in zip(
                prompts, enc["input_ids"], enc["attention_mask"].bool(), answers
            )
        ]

    @torch.no_grad()
    def decode(
        self, enc, sampling: SamplingConfig, seeds: list[int], grammars: list[str]
    ) -> list[tuple[list[int], list[float]]]:
        """Each row's answer: its tokens (to end-of-sequence, which is kept, or max_new_tokens of them) and the
        log-probability of each, log softmax(logits / T) of the raw logits (T = 1 when greedy), before any mask.
        A row with a grammar chooses among the tokens its xgrammar matcher allows; a sampled row draws with its own
        seed (`draw`); a greedy row takes the most likely token.

        Rows that have ended leave the batch (their keys and values with them) once they are a quarter of it: a
        decoding step's cost on a CPU is a fixed ~85 ms (the weights read once, whatever the rows) plus ~4 ms a row
        (a 135M model in fp32 on 2 cores), and transformers' `generate` runs every row until the batch's longest
        answer ends: in a held-out validation 8832 row-steps were computed for 5116 tokens. Every row's answer is
        the one a batch of its own gives (tests/test_models.py)."""
        eos = self.tokenizer.eos_token_id
        greedy = sampling.temperature <= 0
        temperature = 1.0 if greedy else sampling.temperature
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        matchers = self.matchers(grammars)
        inputs, cache = self.prefill(enc)
        mask = inputs["attention_mask"]
        if cache:  # the prompts but their last tokens are in the cache
            step_ids, positions = inputs["input_ids"][:, -1:], mask.sum(-1, keepdim=True) - 1
        else:
            step_ids, positions = inputs["input_ids"], (mask.cumsum(-1) - 1).clamp(min=0)
        rows = list(range(len(seeds)))  # the prompt each batch row answers
        answers: list[tuple[list[int], list[float]]] = [([], []) for _ in rows]
        ended: set[int] = set()  # prompts whose answers are complete (their rows may still be in the batch)
        for _ in range(sampling.max_new_tokens):
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **cache,
            )
            cache = {CACHE: getattr(out, CACHE)}
            logits = out.logits[:, -1].float()
            scores = self.masked(logits, [matchers[r] for r in rows])
            chosen = (
                scores.argmax(-1)
                if greedy
                else draw(scores, temperature, sampling.top_p, [generators[r] for r in rows])
            )
            # log softmax(logits / T) at the chosen tokens, from the raw logits: one gather a step, not a row each
            scaled = logits / temperature
            logprobs = (scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1)).tolist()
            for i, (r, token) in enumerate(zip(rows, chosen.tolist())):
                if r in ended:
                    continue
                answers[r][0].append(token)
                answers[r][1].append(logprobs[i])
                if matchers[r] is not None and not matchers[r].is_terminated():
                    matchers[r].accept_token(token)
                if token == eos:
                    ended.add(r)
            if len(ended) == len(answers):
                break
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            step_ids, positions = chosen.unsqueeze(1), positions[:, -1:] + 1
            if sum(r in ended for r in rows) * 4 >= len(rows):
                keep = torch.tensor([i for i, r in enumerate(rows) if r not in ended], device=mask.device)
                cache[CACHE].batch_select_indices(keep)
                mask, step_ids, positions = mask[keep], step_ids[keep], positions[keep]
                rows = [rows[i] for i in keep.tolist()]
        return answers

    def masked(self, logits: torch.Tensor, matchers: list) -> torch.Tensor:
        """The logits with what each row's grammar forbids at -inf (a row without one as it is)."""
        constrained = [i for i, matcher in enumerate(matchers) if matcher is not None and not matcher.is_terminated()]
        if not constrained:
            return logits
        import xgrammar

        scores = logits.clone()
        bitmask = xgrammar.allocate_token_bitmask(len(matchers), self.model.config.vocab_size)
        for i in constrained:
            matchers[i].fill_next_token_bitmask(bitmask, i)
        xgrammar.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), indices=constrained)
        return scores


def sequence_logprobs(
    model, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """Teacher-forced log-probabilities of `completion_ids` after `prompt_ids` (for checks and training)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion_ids).unsqueeze(-1)).squeeze(-1)


def vllm_available() -> tuple[bool, str]:
    """Whether the vLLM backend can run here, and why not."""
    import importlib.util

    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed (pip install -e '.[gpu]')"
    return True, ""


class VLLMBackend:
    """Generation with vLLM on CUDA, the same interface and the same quantities as TransformersBackend.

    One engine for the life of the process: a new checkpoint's weights are loaded into it in place
    (`load_weights`), never by building a second engine (vLLM does not give a dead engine's GPU memory back).
    Logprobs are vLLM's processed logprobs (after temperature, as the trainer recomputes them), each prompt
    has its own SamplingParams seed, and `gpu_memory_utilization` is the engine's share of the GPU (two roles
    in one process, as in the sync loop, need shares that add up to less than 1).

    Untested: no GPU with vLLM was available where this was written (README, "What has not run"). Weights are
    loaded in place through `collective_rpc` (vLLM's supported way to run code in every worker), the engine's
    scheduler in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as TRL's colocated mode).
    """

    def __init__(
        self,
        model_path: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.4,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
    ):
        ok, why = vllm_available()
        if not ok:
            raise RuntimeError(f"vLLM backend unavailable: {why}")
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model must live in this process
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            dtype=VLLM_DTYPES.get(dtype, dtype),
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            logprobs_mode="processed_logprobs",
            # The longest prompt and answer a run writes; left unset vLLM takes the model's context (32k for
            # Qwen2.5), which need not fit the cache of a small share of the GPU and fails at start.
            max_model_len=max_model_len,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def load_weights(self, checkpoint: str) -> None:
        """Put a checkpoint's weights (its folder of safetensors files, the engine's architecture) into the running
        engine. vLLM's collective_rpc runs `load_into_worker` in every worker, one per tensor-parallel rank and
        perhaps each in its own process; each reads the files and keeps its own shard (the model's load_weights
        shards what it is given). Reaching one worker's model through the executor saw only the first shard, and
        the multiprocess executor has no such worker."""
        self.llm.collective_rpc(load_into_worker, args=(str(checkpoint),))
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values of the old weights

    def close(self) -> None:
        """Shut the engine down and give its GPU memory back (its core, then the model and the cache blocks)."""
        import gc

        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm
        gc.collect()
        torch.cuda.empty_cache()

    def generate(
        self,
        prompts: list[str],
        sampling: SamplingConfig | None = None,
        seeds: list[int] | None = None,
        progress=None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams

        sampling = sampling or SamplingConfig()
        greedy = sampling.temperature <= 0
        grammars = grammars or [""] * len(prompts)
        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens,
                temperature=0.0 if greedy else sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                seed=seed,
                logprobs=0,
                structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
            )
            for seed, grammar in zip(prompt_seeds(sampling, len(prompts), seeds), grammars)
        ]
        # Token ids, not strings: the trainer scores exactly these prompt tokens (prompt_token_ids).
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_ids(self.tokenizer, prompts)]
        out = []
        for prompt, request in zip(prompts, self.llm.generate(requests, params, use_tqdm=False)):
            completion = request.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs, ids)]
            out.append(Generation(prompt, list(request.prompt_token_ids), completion.text, ids, logprobs))
        if progress:
            progress(len(out), len(prompts))
        return out


class VLLMServerBackend:
    """Generation from a vLLM server that TRL's client speaks to, so that rollouts run on other GPUs or nodes than
    training (TRL's server mode). Start the server as TRL documents it:

        VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}' \
            --logprobs-mode processed_logprobs --max-logprobs -1

    Prompts go as token ids (`prompt_token_ids`), each with its own seed and grammar (one request per prompt: the
    server's seed and structured output are per request). A new checkpoint's weights are pushed over NCCL with
    `VLLMClient.update_model_params`, from a copy of the model on this process's CUDA device.

    Untested: no GPU with vLLM was available where this was written (README, "What has not run")."""

    def __init__(
        self, base_url: str, tokenizer, device: str = "cuda", group_port: int = 51216, connection_timeout_s: float = 120
    ):
        from trl.generation.vllm_client import VLLMClient

        # group_port: the NCCL group the weights go through; one per server a process talks to
        self.client = VLLMClient(base_url=base_url, group_port=group_port, connection_timeout=connection_timeout_s)
        self.client.init_communicator(device=device)
        self.tokenizer = tokenizer
        self.device = device

    def load_weights(self, checkpoint: str) -> None:
        """Push a checkpoint's weights (its folder) to the server, in the dtype the server serves."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to(self.device)
        self.client.update_model_params(model)
        self.client.reset_prefix_cache()  # cached prefixes hold keys and values of the old weights
        del model
        torch.cuda.empty_cache()

    def generate(
        self,
        prompts: list[str],
        sampling: SamplingConfig | None = None,
        seeds: list[int] | None = None,
        progress=None,
        grammars: list[str] | None = None,
    ) -> list[Generation]:
        sampling = sampling or SamplingConfig()
        greedy = sampling.temperature <= 0
        grammars = grammars or [""] * len(prompts)
        out = []
        for prompt, ids, seed, grammar in zip(
            prompts, prompt_token_ids(self.tokenizer, prompts), prompt_seeds(sampling, len(prompts), seeds), grammars
        ):
            extra = {"seed": seed, **({"structured_outputs": {"grammar": grammar}} if grammar else {})}
            answer = self.client.generate(
                [ids],
                temperature=0.0 if greedy else sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,
                generation_kwargs=extra,
            )
            completion = answer["completion_ids"][0]
            logprobs = [entry[0] for entry in answer["logprobs"][0]]  # the sampled token's, first of each entry
            text = self.tokenizer.decode(completion, skip_special_tokens=True)
            out.append(Generation(prompt, list(answer["prompt_ids"][0]), text, list(completion), logprobs))
            if progress:
                progress(len(out), len(prompts))
        return out

    def close(self) -> None:
        self.client.close_communicator()


def load_into_worker(worker, checkpoint: str) -> None:
    """Run in a vLLM worker (VLLMBackend.load_weights): its model loads the checkpoint's tensors, a file at a time."""
    from pathlib import Path

    from safetensors import safe_open

    model = worker.model_runner.model
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), "pt") as weights:
            model.load_weights((name, weights.get_tensor(name)) for name in weights.keys())


VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
