"""Generation behind one interface: text, token ids and the log-probability of every sampled token.

`TransformersBackend` batches prompts with left padding and transformers' KV cache. The
log-probabilities are those of the policy the trainer optimises: log_softmax(logits / T)
at each sampled token (T = the sampling temperature, 1 for greedy), which is what a
teacher-forced forward pass of prompt + completion recomputes; top-p only narrows which
tokens are sampled. `VLLMBackend` is imported only where CUDA and vllm exist.

Every prompt is sampled with a seed of its own (`sample_seed`: from the run's seed and what names the
sample, such as the task id and the rollout index), so a task's G rollouts differ from each other,
the same run seed gives the same seeds on a replay, and a sample does not depend on which prompts
were batched with it. vLLM takes one SamplingParams (with its seed) per prompt. transformers'
`generate` has one random stream per call, so `SeededSampling` draws each row's token itself, with
the row's own generator (the Gumbel-max trick: argmax(logits / T + Gumbel noise) is a sample of
softmax(logits / T)), and generate runs greedy over those choices.

A prompt may come with a grammar (EBNF, xgrammar's dialect): its tokens are then masked to what the grammar
allows, by xgrammar's transformers logits processor (or vLLM's structured outputs, whose default backend is
xgrammar too), so both backends read one grammar. The log-probabilities recorded stay the model's own,
unmasked: the trainers recompute those.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace

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
    # The answer ends where one of these first appears, kept in it (`cut_at_stop`): a domain's end of answer, e.g.
    # the blank line after toolcall's calls. Every backend's generations are cut the same way.
    stop: tuple[str, ...] = ()


@dataclass
class Generation:
    prompt: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # completion tokens, the end-of-sequence token included when produced
    logprobs: list[float]  # one per completion token


def cut_at_stop(generation: Generation, tokenizer, stop: tuple[str, ...]) -> Generation:
    """The generation up to the token that completes its first stop string (that token kept), with its text, token
    ids and log-probabilities cut alike, so that a trainer scores exactly the tokens the answer kept. A backend may
    have stopped there itself (HF's stop_strings, vLLM's stop) or not; either way the cut is made here."""
    if not stop or not any(s in generation.text for s in stop):
        return generation
    ids = generation.token_ids
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if any(s in text for s in stop):
            return replace(generation, text=text, token_ids=ids[:k], logprobs=generation.logprobs[:k])
    return generation


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


class SeededSampling:
    """A transformers logits processor that samples each row with its own torch.Generator: softmax(logits / T)
    restricted to the top-p nucleus, drawn by Gumbel-max. It returns scores where only the drawn token is finite,
    so greedy decoding emits exactly the draw; the raw logits transformers reports are untouched."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = logits.sort(dim=-1, descending=True)
            outside = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1) >= self.top_p  # the first token always stays
            logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside), float("-inf"))
        uniform = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in self.generators]).to(logits.device)
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1 - 1e-7)))
        chosen = (logits + gumbel).argmax(-1, keepdim=True)
        return torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)


class ChosenLogprobs:
    """A transformers logits processor that records log softmax(logits / T) of each token generated, from the raw
    logits (it must come before any processor that changes them) and one step behind: at step k the token chosen at
    step k - 1 is the last input id. transformers' own `output_logits` keeps every step's logits, (batch, new
    tokens, vocabulary) in fp32: 0.45 GB for a batch of 32 answers of 72 tokens of a 49k vocabulary, and as much
    again for their log-softmax, the largest thing in a process generating with a 135M model."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []  # (batch,) per step, the steps before the last
        self.last: torch.Tensor | None = None  # the latest step's log-probabilities, (batch, vocabulary)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.steps.append(self.last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def of(self, sequences: torch.Tensor) -> torch.Tensor:
        """(batch, new tokens): the log-probability of each token of `sequences`, the generated part."""
        if self.last is None:
            return torch.zeros(sequences.shape, dtype=torch.float32)
        final = self.last.gather(-1, sequences[:, -1:]).squeeze(-1)
        return torch.stack([*self.steps, final], dim=1).cpu()


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


ANY_TEXT = "root ::= [^]*"  # the grammar of a row left free in a batch whose other rows are constrained


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
        # Batches of prompts of similar length: less padding, and answers that tend to end together (a batch
        # runs until its longest answer ends). Each sample depends only on its prompt and seed, so the order
        # changes no result.
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

    def constraint(self, grammars: list[str]) -> list:
        """xgrammar's logits processor for a batch whose rows have grammars (a free row gets one that allows any
        text); none when no row has one."""
        if not any(grammars):
            return []
        from xgrammar.contrib.hf import LogitsProcessor

        compiler = grammar_compiler(self.tokenizer, self.model.config.vocab_size)
        return [LogitsProcessor([compiler.compile_grammar(g or ANY_TEXT) for g in grammars])]

    @torch.no_grad()
    def shared_prefill(self, enc) -> dict:
        """generate's starting cache for a batch whose prompts repeat (a task's group_size rollouts): each distinct
        prompt encoded once and its keys and values copied to the rows that repeat it, as `pack_shared` does for
        training (trainers/batching.py). Encoding every row's prompt was G times the work for G rollouts of a
        task, on a CPU more than half of a rollout batch's time. The last prompt token is left out, for generate's
        first step to run on; positions follow the attention mask, as generate's own do. {} (generate encodes the
        prompts) when no prompt repeats."""
        ids, mask = enc["input_ids"], enc["attention_mask"]
        keys = [tuple(row) for row in ids.tolist()]  # a prompt's ids, padding included
        slot: dict[tuple, int] = {}  # a prompt -> its place among the distinct ones
        for key in keys:
            slot.setdefault(key, len(slot))
        if len(slot) == len(keys) or int(mask.sum(-1).min()) < 2:
            return {}
        distinct = [keys.index(key) for key in slot]  # the first row of each distinct prompt
        rows = torch.tensor([slot[key] for key in keys], device=ids.device)
        prefix_mask = mask[distinct, :-1]
        encoded = self.model(
            input_ids=ids[distinct, :-1],
            attention_mask=prefix_mask,
            position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = getattr(encoded, CACHE)
        cache.batch_select_indices(rows)
        return {CACHE: cache}

    def _generate_batch(
        self, prompts: list[str], sampling: SamplingConfig, seeds: list[int], grammars: list[str]
    ) -> list[Generation]:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
        greedy = sampling.temperature <= 0
        # The recorder first (it reads the raw logits; xgrammar masks them in place), then the masks, so that the
        # sampler draws among the allowed tokens.
        recorder = ChosenLogprobs(1.0 if greedy else sampling.temperature)
        sampler = [recorder, *self.constraint(grammars)]
        sampler += [] if greedy else [SeededSampling(seeds, sampling.temperature, sampling.top_p)]
        was_training = self.model.training
        self.model.eval()
        result = self.model.generate(
            **enc,
            **self.shared_prefill(enc),
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            logits_processor=sampler,
            return_dict_in_generate=True,
            use_cache=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **({"stop_strings": list(sampling.stop), "tokenizer": tok} if sampling.stop else {}),
        )
        self.model.train(was_training)
        prompt_len = enc["input_ids"].shape[1]
        sequences = result.sequences[:, prompt_len:]
        logprobs = recorder.of(sequences)
        generations = []
        for i, prompt in enumerate(prompts):
            ids = sequences[i].tolist()
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id) + 1]
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            # A row that met a stop string was padded after it with the pad token, which is the end-of-sequence
            # token here: cut_at_stop takes the answer back to the stop string.
            generation = Generation(
                prompt=prompt,
                prompt_token_ids=prompt_ids,
                text=tok.decode(ids, skip_special_tokens=True),
                token_ids=ids,
                logprobs=logprobs[i, : len(ids)].tolist(),
            )
            generations.append(cut_at_stop(generation, tok, sampling.stop))
        return generations


def sequence_logprobs(
    model, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """Teacher-forced log-probabilities of `completion_ids` after `prompt_ids` (for checks, training and guide rows),
    on the CPU whichever device the model is on."""
    ids = torch.tensor([prompt_ids + completion_ids], device=next(model.parameters()).device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float().cpu() / temperature
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
                stop=list(sampling.stop) or None,
                include_stop_str_in_output=True,
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
            generation = Generation(prompt, list(request.prompt_token_ids), completion.text, ids, logprobs)
            out.append(cut_at_stop(generation, self.tokenizer, sampling.stop))
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
            if sampling.stop:
                extra |= {"stop": list(sampling.stop), "include_stop_str_in_output": True}
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
            generation = Generation(prompt, list(answer["prompt_ids"][0]), text, list(completion), logprobs)
            out.append(cut_at_stop(generation, self.tokenizer, sampling.stop))
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
