"""The co-evolution: its roles, the sync loop that calls them in order, the run's config and the curriculum reward.

roles.py       Simulator, Rollouts, Scorer, Updater: events in, events out; constructors do no I/O
sync.py        CoEvolution: the paper's epoch, the roles in order, every event through Kafka and the lake
writer.py      LakeWriter: publish events, then ingest until they have landed (the sync loop's way into the lake)
curriculum.py  the alpha-curriculum: R_env, the band, the RWR weight
config.py      RunConfig: profiles, TOML files, --set overrides (overrides.py: typed name=value parsing)
experiment.py  the ablation: every mode at equal rollout budget over seeds
progress.py    Say and Phase, how long work reports itself
"""

from .config import (
    MODES,
    PROFILES,
    RunConfig,
    check_async,
    check_machine,
    check_plan,
    check_run_id,
    load_config,
    record_run_config,
    recorded_run_config,
    run_config_path,
    to_toml,
)
from .curriculum import CurriculumConfig, GroupScore, env_reward, in_band, in_band_share, score_groups
from .experiment import run_ablation, write_answers
from .progress import Phase, Say, no_phase
from .roles import (
    GeneratedTask,
    ModelRole,
    Rollouts,
    Scorer,
    Simulator,
    Updater,
    Validation,
    checkpoint_event,
    generated_task,
    run_version,
    task_of,
)
from .sync import CoEvolution, EpochMetrics
from .writer import LakeWriter, publish_checkpoint

__all__ = [
    "MODES",
    "PROFILES",
    "CoEvolution",
    "CurriculumConfig",
    "EpochMetrics",
    "GeneratedTask",
    "GroupScore",
    "LakeWriter",
    "ModelRole",
    "Phase",
    "Rollouts",
    "RunConfig",
    "Say",
    "Scorer",
    "Simulator",
    "Updater",
    "Validation",
    "check_async",
    "check_machine",
    "check_plan",
    "check_run_id",
    "checkpoint_event",
    "env_reward",
    "generated_task",
    "in_band",
    "in_band_share",
    "load_config",
    "no_phase",
    "publish_checkpoint",
    "record_run_config",
    "recorded_run_config",
    "run_ablation",
    "run_config_path",
    "run_version",
    "score_groups",
    "task_of",
    "to_toml",
    "write_answers",
]
