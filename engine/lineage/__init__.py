"""Lineage: what the lake tells about a run after the fact. Every tool here reads the lake; none trains or publishes.

audit.py    where a task, checkpoint or epoch came from and what it caused
replay.py   rebuild an epoch from the bronze log into a scratch lake and retrain its checkpoints bit for bit
metrics.py  a run's per-epoch metrics computed from the lake (async runs' reports, the web view)
measures.py whether the curriculum bites: selection bias, informative groups, success per level, per epoch
fields.py   reading the JSON a producer wrote into an event's text fields
report.py   a run's report folder, and the plots the report and the web view share
ui.py       `genenv ui`: a read-only web view of a lake
"""

from .audit import AuditError, audit_checkpoint, audit_epoch, audit_task
from .measures import CurriculumMeasures, curriculum_measures
from .metrics import difficulty_means, metrics_from_lake, with_measures
from .replay import ReplayError, ReplayResult, replay_epoch
from .report import PLOTS, draw, write_report
from .ui import create_app, serve

__all__ = [
    "PLOTS",
    "AuditError",
    "CurriculumMeasures",
    "ReplayError",
    "ReplayResult",
    "audit_checkpoint",
    "audit_epoch",
    "audit_task",
    "create_app",
    "curriculum_measures",
    "difficulty_means",
    "draw",
    "metrics_from_lake",
    "replay_epoch",
    "serve",
    "with_measures",
    "write_report",
]
