"""Generation behind one interface: text, token ids and the log-probability of every sampled token.

`TransformersBackend` batches prompts with left padding and transformers' KV cache. The
log-probabilities are those of the policy the trainer optimises: log_softmax(logits / T)
at each sampled token (T = the sampling temperature, 1 for greedy), which is what a
teacher-forced forward pass of prompt + completion recomputes; top-p only narrows which
tokens are sampled. `VLLMBackend` is imported only where CUDA and vllm exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def render_prompt(tokenizer, user_text: str, system: str | None = None) -> str:
    """The prompt string the model sees: its chat template where it has one."""
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (system + "\n\n" if system else "") + user_text


class TransformersBackend:
    def __init__(self, model, tokenizer, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling: SamplingConfig | None = None, progress=None) -> list[Generation]:
        """progress(done, total), if given, is called after every batch with the prompts done so far."""
        sampling = sampling or SamplingConfig()
        out: list[Generation] = []
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(sampling.seed)
        try:
            for start in range(0, len(prompts), self.batch_size):
                out.extend(self._generate_batch(prompts[start:start + self.batch_size], sampling))
                if progress:
                    progress(len(out), len(prompts))
        finally:
            torch.random.set_rng_state(generator_state)
        return out

    def _generate_batch(self, prompts: list[str], sampling: SamplingConfig) -> list[Generation]:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        greedy = sampling.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        result = self.model.generate(
            **enc, max_new_tokens=sampling.max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
            top_k=None, return_dict_in_generate=True, output_logits=True, use_cache=True,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )
        self.model.train(was_training)
        prompt_len = enc["input_ids"].shape[1]
        sequences = result.sequences[:, prompt_len:]
        temperature = 1.0 if greedy else sampling.temperature
        logits = torch.stack(result.logits, dim=1).float() / temperature  # (batch, new, vocab)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)
        generations = []
        for i, prompt in enumerate(prompts):
            ids = sequences[i].tolist()
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id) + 1]
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            generations.append(Generation(
                prompt=prompt, prompt_token_ids=prompt_ids,
                text=tok.decode(ids, skip_special_tokens=True), token_ids=ids,
                logprobs=logprobs[i, : len(ids)].tolist(),
            ))
        return generations


def sequence_logprobs(model, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced log-probabilities of `completion_ids` after `prompt_ids` (for checks and training)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float() / temperature
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
    """Generation with vLLM on CUDA; same output as TransformersBackend."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1):
        ok, why = vllm_available()
        if not ok:
            raise RuntimeError(f"vLLM backend unavailable: {why}")
        from vllm import LLM

        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[str], sampling: SamplingConfig | None = None, progress=None) -> list[Generation]:
        from vllm import SamplingParams

        sampling = sampling or SamplingConfig()
        params = SamplingParams(max_tokens=sampling.max_new_tokens, temperature=max(sampling.temperature, 0.0),
                                top_p=sampling.top_p, seed=sampling.seed, logprobs=0)
        out = []
        for request in self.llm.generate(prompts, params):
            completion = request.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs, ids)]
            out.append(Generation(request.prompt, list(request.prompt_token_ids), completion.text, ids, logprobs))
        return out
