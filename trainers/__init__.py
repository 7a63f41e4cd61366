"""Model loading, generation backends (and, to come, GRPO for the agent, RWR for the simulator, checkpoints)."""

from .generation import Generation, SamplingConfig, TransformersBackend, VLLMBackend, render_prompt, sequence_logprobs, vllm_available
from .models import BUILTINS, LoadedModel, ModelNotFound, load_model

__all__ = [
    "BUILTINS", "Generation", "LoadedModel", "ModelNotFound", "SamplingConfig", "TransformersBackend", "VLLMBackend",
    "load_model", "render_prompt", "sequence_logprobs", "vllm_available",
]
