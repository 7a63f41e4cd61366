"""The co-evolution engine, by job:

    engine/coevolution/  the roles (Simulator, Rollouts, Scorer, Updater), the sync loop, the run config, the curriculum
    engine/workers/      the async mode: each role in a Kafka consumer loop, and `genenv run --async`'s launcher
    engine/lineage/      audit, replay, per-epoch metrics from the lake, reports and plots, the web view
    engine/domains/      arith, toolcall, qa: seeds, prompts, parsers and checkers (calls.py: the tool-call matcher)
    engine/benchmarks/   offline evaluation of any checkpoint: BFCL, API-Bank, Bamboogle, ALFWorld, TravelPlanner
    engine/cli/          the `genenv` command line

Dependencies point one way: cli -> workers, lineage -> coevolution -> domains; benchmarks -> domains. The public
surface is below; names are imported on first use (`from engine import CoEvolution`), so `genenv` commands that
need no model do not pay for importing torch.
"""

from importlib import import_module

_PUBLIC = {
    **dict.fromkeys(
        (
            "CoEvolution",
            "EpochMetrics",
            "RunConfig",
            "load_config",
            "recorded_run_config",
            "CurriculumConfig",
            "score_groups",
            "LakeWriter",
            "Simulator",
            "Rollouts",
            "Scorer",
            "Updater",
        ),
        "engine.coevolution",
    ),
    **dict.fromkeys(("run_async", "worker"), "engine.workers"),
    **dict.fromkeys(
        (
            "audit_task",
            "audit_checkpoint",
            "audit_epoch",
            "AuditError",
            "replay_epoch",
            "ReplayError",
            "metrics_from_lake",
            "create_app",
        ),
        "engine.lineage",
    ),
    **dict.fromkeys(("get_domain",), "engine.domains"),
    **dict.fromkeys(("evaluate", "model_agent"), "engine.benchmarks"),
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
