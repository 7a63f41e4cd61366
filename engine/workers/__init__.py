"""The async mode: each co-evolution role as a long-running Kafka consumer, and the launcher that runs them on one machine.

    worker.py    SimulatorWorker, RolloutWorker, RewardWorker, TrainerWorker: one role in a consumer loop each
    launcher.py  `genenv run --async`: warm start, one process per role, wait, stop, report
"""

from .launcher import run_async
from .worker import ROLES, RewardWorker, RolloutWorker, SimulatorWorker, TrainerWorker, Worker, worker

__all__ = ["ROLES", "RewardWorker", "RolloutWorker", "SimulatorWorker", "TrainerWorker", "Worker", "run_async", "worker"]
