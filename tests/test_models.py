"""Model loading and generation with real (tiny and packaged) models."""

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.coevolution.roles import rollout_seed
from trainers import (
    ModelNotFound,
    SamplingConfig,
    TransformersBackend,
    load_model,
    render_prompt,
    sequence_logprobs,
    vllm_available,
)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3)


@pytest.mark.unit
def test_tiny_is_deterministic_from_its_seed():
    a, b, c = load_model("tiny", seed=1), load_model("tiny", seed=1), load_model("tiny", seed=2)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


@pytest.mark.unit
def test_tiny_tokenizer_round_trips_any_text(tiny):
    text = "What is 12 + 7? Ünïcode ✓ and spaces  "
    assert tiny.tokenizer.decode(tiny.tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.unit
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampled_logprobs_match_a_teacher_forced_recomputation(tiny, temperature):
    backend = TransformersBackend(tiny.model, tiny.tokenizer, batch_size=3)
    prompts = [render_prompt(tiny.tokenizer, p) for p in ("What is 2+2?", "hi", "a longer prompt to force padding")]
    generations = backend.generate(prompts, SamplingConfig(max_new_tokens=12, temperature=temperature, seed=5))
    assert len(generations) == 3
    for g in generations:
        assert len(g.token_ids) == len(g.logprobs) > 0
        reference = sequence_logprobs(tiny.model, g.prompt_token_ids, g.token_ids, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(g.logprobs), reference.detach(), atol=1e-4, rtol=1e-4)


@pytest.mark.unit
def test_repeated_prompts_are_encoded_once_and_sample_as_if_each_were_encoded(tiny):
    """A batch of G rollouts of each of its tasks starts from each distinct prompt encoded once (shared_prefill):
    the same tokens as every prompt encoded on its own, and log-probabilities a teacher-forced pass recomputes, with
    prompts of different lengths (left padding) side by side."""
    tok = tiny.tokenizer
    distinct = [render_prompt(tok, p) for p in ("What is 2+2?", "a longer prompt to force some padding")]
    prompts = [p for p in distinct for _ in range(3)]
    backend = TransformersBackend(tiny.model, tok, batch_size=6)
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert backend.shared_prefill(batch) and not backend.shared_prefill(
        tok(distinct, return_tensors="pt", padding=True)
    )
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0)
    seeds = [rollout_seed(7, "run", "run-e0-t3", i) for i in range(6)]
    shared = backend.generate(prompts, sampling, seeds)
    alone = TransformersBackend(tiny.model, tok, batch_size=1).generate(prompts, sampling, seeds)
    assert [g.token_ids for g in shared] == [g.token_ids for g in alone]
    for g in shared:
        reference = sequence_logprobs(tiny.model, g.prompt_token_ids, g.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), reference.detach(), atol=1e-4, rtol=1e-4)


@pytest.mark.unit
def test_an_answer_ends_at_its_first_stop_string_its_tokens_and_logprobs_cut_alike(tiny):
    """A stop string (a domain's `agent_stop`) ends each answer at the token that completes it: the same samples as
    without it up to there (the same seeds), the text, token ids and log-probabilities cut alike, and an answer
    that never meets it left whole."""
    tok = tiny.tokenizer
    backend = TransformersBackend(tiny.model, tok, batch_size=3)
    prompts = [render_prompt(tok, p) for p in ("What is 2+2?", "hi", "a longer prompt to force padding")]
    free = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=1.0, seed=5))
    stop = tok.decode(free[0].token_ids[4:6], skip_special_tokens=True)  # the first answer meets it by its 6th token
    assert stop.strip()
    cut = backend.generate(prompts, SamplingConfig(max_new_tokens=16, temperature=1.0, seed=5, stop=(stop,)))
    assert len(cut[0].token_ids) <= 6
    for whole, answer in zip(free, cut):
        n = len(answer.token_ids)
        assert answer.token_ids == whole.token_ids[:n] and len(answer.logprobs) == n
        torch.testing.assert_close(torch.tensor(answer.logprobs), torch.tensor(whole.logprobs[:n]))
        assert answer.text == tok.decode(answer.token_ids, skip_special_tokens=True)
        if stop in whole.text:
            assert stop in answer.text and stop not in tok.decode(answer.token_ids[:-1], skip_special_tokens=True)
        else:
            assert answer == whole


@pytest.mark.unit
def test_same_seed_same_samples(tiny):
    backend = TransformersBackend(tiny.model, tiny.tokenizer)
    prompts = [render_prompt(tiny.tokenizer, "x")] * 2
    first = backend.generate(prompts, SamplingConfig(max_new_tokens=8, seed=11))
    second = backend.generate(prompts, SamplingConfig(max_new_tokens=8, seed=11))
    assert [g.token_ids for g in first] == [g.token_ids for g in second]


@pytest.mark.unit
def test_a_random_model_constrained_by_the_request_grammar_writes_requests_that_parse(tiny):
    """xgrammar's mask (trainers/generation.py) keeps a random model to toolcall's request grammar: every output
    carries one candidate's values, so the domain's parser reads each as a valid task; a free row beside them
    stays free, and the recorded logprobs are still the model's own, unmasked."""
    import random

    from engine.domains import Task, get_domain

    domain = get_domain("toolcall")
    rng = random.Random(4)
    requests = [domain.simulator_request(rng, "none yet") for _ in range(6)]
    backend = TransformersBackend(tiny.model, tiny.tokenizer, batch_size=7)
    # Short prompts: the tiny model's byte tokens make the real request prompt most of its 512 positions.
    prompts = [render_prompt(tiny.tokenizer, f"request {i}") for i in range(len(requests) + 1)]
    # Room for the longest form of a three-call candidate in the tiny model's byte tokens.
    sampling = SamplingConfig(max_new_tokens=420, temperature=1.0, seed=2)
    generations = backend.generate(prompts, sampling, grammars=[r.grammar for r in requests] + [""])
    parsed = [domain.parse(g.text, r.context) for g, r in zip(generations, requests)]
    assert all(isinstance(p, Task) for p in parsed), [(g.text, p) for g, p in zip(generations, parsed)]
    unconstrained = [domain.parse(g.text, r.context) for g, r in zip(backend.generate(prompts[:6], sampling), requests)]
    assert not any(isinstance(p, Task) for p in unconstrained), "a random model writes no valid request by itself"
    for g in generations:
        reference = sequence_logprobs(tiny.model, g.prompt_token_ids, g.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(g.logprobs), reference.detach(), atol=1e-4, rtol=1e-4)


@pytest.mark.unit
def test_a_chat_template_that_writes_its_bos_gets_one_bos_and_every_component_the_same_ids(tiny):
    """A Llama-style tokenizer adds BOS to any text it encodes, and its chat template writes one too: a string
    handed to vLLM got two, while the trainer scored one. Every component takes `prompt_token_ids`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from trainers.generation import prompt_token_ids

    words = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    prompt = render_prompt(tokenizer, "hello world")
    assert tokenizer(prompt)["input_ids"] == [0, 0, 3, 4]  # what a tokenizer left to add special tokens makes
    assert prompt_token_ids(tokenizer, [prompt]) == [[0, 3, 4]]
    # The transformers backend generates after exactly the ids the trainers score.
    texts = [render_prompt(tiny.tokenizer, "hi"), render_prompt(tiny.tokenizer, "a longer prompt")]
    backend = TransformersBackend(tiny.model, tiny.tokenizer)
    generated = backend.generate(texts, SamplingConfig(max_new_tokens=2, seed=0))
    assert [g.prompt_token_ids for g in generated] == prompt_token_ids(tiny.tokenizer, texts)


@pytest.mark.integration
def test_smollm2_loads_from_the_packaged_gguf_and_answers():
    loaded = load_model("smollm2-135m")
    backend = TransformersBackend(loaded.model, loaded.tokenizer)
    prompt = render_prompt(loaded.tokenizer, "What is the capital of France? Answer in one word.")
    (g,) = backend.generate([prompt], SamplingConfig(max_new_tokens=12, temperature=0))
    assert "paris" in g.text.lower()
    reference = sequence_logprobs(loaded.model, g.prompt_token_ids, g.token_ids)
    torch.testing.assert_close(torch.tensor(g.logprobs), reference.detach(), atol=1e-3, rtol=1e-3)


@pytest.mark.unit
@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-model", "unknown model 'no-such-model'"),
        ("/nonexistent/model.gguf", "GGUF file /nonexistent/model.gguf does not exist"),
        ("/tmp", "without config.json"),
    ],
)
def test_unknown_models_fail_with_one_line_naming_them(spec, message):
    with pytest.raises(ModelNotFound) as info:
        load_model(spec)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.unit
def test_vllm_backend_is_skipped_with_its_reason_without_cuda():
    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vLLM backend: {why}")
    from trainers import VLLMBackend

    backend = VLLMBackend(str(load_model("smollm2-135m").source))
    (g,) = backend.generate(["The capital of France is"], SamplingConfig(max_new_tokens=4, temperature=0))
    assert len(g.token_ids) == len(g.logprobs)


@pytest.mark.unit
def test_a_groups_samples_differ_and_each_depends_only_on_its_own_seed(tiny):
    """The G rollouts of a task get distinct seeds, so they are not copies of each other (GRPO's advantages would
    all be 0); a sample is the same whichever prompts were batched with it, and on every replay."""
    prompt = render_prompt(tiny.tokenizer, "What is 2+2?")
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0)
    seeds = [rollout_seed(7, "run", "run-e0-t3", i) for i in range(4)]
    together = TransformersBackend(tiny.model, tiny.tokenizer, batch_size=4).generate([prompt] * 4, sampling, seeds)
    alone = TransformersBackend(tiny.model, tiny.tokenizer, batch_size=1).generate([prompt] * 4, sampling, seeds)
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in together}) > 1, "a group's rollouts came out identical"
    again = TransformersBackend(tiny.model, tiny.tokenizer).generate([prompt] * 4, sampling, seeds)
    assert [g.token_ids for g in again] == [g.token_ids for g in together]


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(
    run_seed=st.integers(0, 2**63 - 1),
    task_ids=st.sets(st.text(min_size=1, max_size=40), min_size=1, max_size=20),
    group=st.integers(2, 16),
)
def test_every_rollout_of_a_run_gets_its_own_seed_and_a_replay_or_rerun_the_same(run_seed, task_ids, group):
    seeds = [rollout_seed(run_seed, "run-a", f"run-a-{task}", i) for task in sorted(task_ids) for i in range(group)]
    assert len(set(seeds)) == len(seeds)
    # a replay, and another run of the same config (another run id), sample every rollout with the same seed
    again = [rollout_seed(run_seed, "run-b", f"run-b-{task}", i) for task in sorted(task_ids) for i in range(group)]
    assert seeds == again
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.integration
def test_the_gpu_check_runs_on_the_cpu_with_a_small_config():
    """tests/gpu/check.sh is what runs once a GPU is lent; on the CPU it proves it still imports and passes."""
    from conftest import ROOT

    result = subprocess.run(
        ["bash", "tests/gpu/check.sh", "--device", "cpu", "--small"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    report, async_memory, ddp, tensor_parallel = map(json.loads, result.stdout.strip().splitlines())
    assert report["ok"] and report["groups_with_distinct_samples"] == "4/4" and report["weights_moved"]
    assert async_memory["ok"] and len(async_memory["copies"]) == 4  # two rollout workers, validation, simulator
    assert ddp["ok"] and ddp["device"] == "cpu"  # two gloo ranks
    assert tensor_parallel["skipped"]  # no vLLM here
