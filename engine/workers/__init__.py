"""The async mode: each co-evolution role as a long-running Kafka consumer, and the launcher that runs them on one
machine.

worker.py      SimulatorWorker, RolloutWorker, RewardWorker, TrainerWorker: one role each, in a consumer group
               (rollout, reward) or driven by the lake (simulator, trainers)
supervisor.py  restarts a worker process that dies, a bounded number of times, recording each restart
launcher.py    `genenv run --async`: warm start, the workers under the supervisor, wait, stop, check the lake
resume.py      `genenv run --async --resume`: what a lost broker lost, sent again from the lake
"""

from .launcher import RunInterrupted, run_async
from .worker import ROLES, RewardWorker, RolloutWorker, SimulatorWorker, TrainerWorker, Worker, worker

__all__ = [
    "ROLES",
    "RunInterrupted",
    "RewardWorker",
    "RolloutWorker",
    "SimulatorWorker",
    "TrainerWorker",
    "Worker",
    "run_async",
    "worker",
]
