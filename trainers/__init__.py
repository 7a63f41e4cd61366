"""Models, generation with logprobs, GRPO for the agent, RWR for the simulator, checkpoints with lineage."""

from .checkpoints import (
    KINDS,
    CheckpointError,
    CheckpointRecord,
    latest_version,
    load_checkpoint,
    load_published,
    load_verified,
    manifest,
    registered,
    registry,
)
from .generation import (
    Generation,
    SamplingConfig,
    TransformersBackend,
    VLLMBackend,
    render_prompt,
    sample_seed,
    sequence_logprobs,
    vllm_available,
)
from .grpo import GRPOConfig, GRPOTrainer
from .loop import OptimizerState
from .losses import GRPOLossConfig, group_advantages, grpo_loss, rwr_loss, rwr_weights
from .models import BUILTINS, CPU, LoadedModel, ModelNotFound, Precision, load_model
from .rwr import RWRConfig, RWRTrainer
from .update import (
    POOL_OF,
    TrainError,
    config_from_manifest,
    default_config,
    fit,
    new_rows,
    select_update_rows,
    train_update,
)

__all__ = [
    "BUILTINS",
    "CPU",
    "KINDS",
    "POOL_OF",
    "CheckpointError",
    "CheckpointRecord",
    "GRPOConfig",
    "GRPOLossConfig",
    "GRPOTrainer",
    "Generation",
    "LoadedModel",
    "ModelNotFound",
    "OptimizerState",
    "Precision",
    "RWRConfig",
    "RWRTrainer",
    "SamplingConfig",
    "TrainError",
    "TransformersBackend",
    "VLLMBackend",
    "config_from_manifest",
    "default_config",
    "fit",
    "group_advantages",
    "grpo_loss",
    "latest_version",
    "load_checkpoint",
    "load_model",
    "load_published",
    "load_verified",
    "manifest",
    "new_rows",
    "registered",
    "registry",
    "render_prompt",
    "rwr_loss",
    "rwr_weights",
    "sample_seed",
    "select_update_rows",
    "sequence_logprobs",
    "train_update",
    "vllm_available",
]
