"""Synthetic epochs of well-formed events, shaped like a real run's (an arithmetic domain, G rollouts
per task, one BatchScored per batch), for the data plane's tests and the ingest benchmark: they
exercise Kafka and the lake without the cost of models.
"""

from __future__ import annotations

import random

from streams import BatchScored, Event, EventProducer, RewardScored, RolloutCompleted, TaskGenerated


def epoch_events(
    run_id: str = "run-test", epoch: int = 0, tasks: int = 4, group: int = 4, seed: int = 0, batch_size: int = 4
) -> list[Event]:
    """One epoch's worth of events: tasks, G rollouts and rewards each, and one BatchScored per batch."""
    rng = random.Random(seed * 1_000_003 + epoch)
    events: list[Event] = []
    for b in range(0, tasks, batch_size):
        batch_id = f"{run_id}-e{epoch}-b{b // batch_size}"
        task_ids, successes, rollouts = [], 0, 0
        for t in range(b, min(b + batch_size, tasks)):
            task_id = f"{run_id}-e{epoch}-t{t}"
            task_ids.append(task_id)
            a, c = rng.randint(1, 99), rng.randint(1, 99)
            events.append(
                TaskGenerated(
                    run_id=run_id,
                    epoch=epoch,
                    task_id=task_id,
                    batch_id=batch_id,
                    domain="arith",
                    env_model_version="0",
                    sim_prompt="Write an addition problem.",
                    raw_generation=f"What is {a} + {c}?",
                    task_prompt=f"What is {a} + {c}?",
                    reference_json=str(a + c),
                    difficulty_json='{"digits": 2}',
                    produced_at=0.0,
                )
            )
            for g in range(group):
                rollout_id = f"{task_id}-r{g}"
                answer = a + c if rng.random() < 0.5 else a + c + 1
                events.append(
                    RolloutCompleted(
                        run_id=run_id,
                        epoch=epoch,
                        rollout_id=rollout_id,
                        task_id=task_id,
                        group_index=g,
                        agent_model_version="0",
                        prompt=f"What is {a} + {c}?",
                        completion=str(answer),
                        completion_token_ids=[rng.randint(0, 1000) for _ in range(3)],
                        behaviour_logprobs=[-rng.random() for _ in range(3)],
                        produced_at=0.0,
                    )
                )
                ok = answer == a + c
                successes += ok
                rollouts += 1
                events.append(
                    RewardScored(
                        run_id=run_id,
                        epoch=epoch,
                        rollout_id=rollout_id,
                        task_id=task_id,
                        reward=float(ok),
                        success=ok,
                        checker_detail="exact" if ok else "mismatch",
                        produced_at=0.0,
                    )
                )
        p_hat = successes / rollouts
        events.append(
            BatchScored(
                run_id=run_id,
                epoch=epoch,
                batch_id=batch_id,
                task_ids=task_ids,
                granularity="batch",
                p_hat=p_hat,
                env_reward=max(0.0, 1 - 4 * (p_hat - 0.5) ** 2),
                weight=1.0,
                filtered=abs(p_hat - 0.5) > 0.1,
                n_tasks=len(task_ids),
                n_rollouts=rollouts,
                n_success=successes,
                produced_at=0.0,
            )
        )
    return events


def publish(bootstrap: str, events: list[Event]) -> int:
    with EventProducer(bootstrap, client_id="genenv-demo") as producer:
        for event in events:
            producer.send(event)
    return len(events)
