"""The co-evolution engine: the loop, domains, curriculum reward, CLI, reports, audit, replay and the web view.

The public surface is below; names are imported on first use (`from engine import Engine`), so `genenv`
commands that need no model do not pay for importing torch.
"""

from importlib import import_module

_PUBLIC = {
    "Engine": "engine.loop", "EpochMetrics": "engine.loop",
    "RunConfig": "engine.config", "load_config": "engine.config", "recorded_run_config": "engine.config",
    "CurriculumConfig": "engine.curriculum", "score_groups": "engine.curriculum",
    "get_domain": "engine.domains",
    "LakeWriter": "engine.publishing",
    "run_async": "engine.streaming", "metrics_from_lake": "engine.streaming",
    "audit_task": "engine.audit", "audit_checkpoint": "engine.audit", "audit_epoch": "engine.audit", "AuditError": "engine.audit",
    "replay_epoch": "engine.replay", "ReplayError": "engine.replay",
    "create_app": "engine.ui",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
