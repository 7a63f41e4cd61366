"""Great Expectations suites, one per event kind, and a runner that says which rows failed which check.

The event contract (types, encoding, ids: streams/events.py `decode`, docs/EVENTS.md) has been enforced
before a row gets here, so a kind's frame is typed (int64, float64, bool and string columns) and its suite
checks content only:

- numbers in range (epoch >= 0, reward and p_hat in [0, 1], counts >= 0, ...);
- values from a set (granularity, model_kind);
- text lengths bounded (ids 256 characters, text 200,000);
- rollouts and rewards refer to a task that has landed.

A failing row is named by the checks it failed, in suite order, as "<expectation type>(<column>)", e.g.
"expect_column_values_to_be_between(reward)". An expectation that cannot be evaluated at all raises
SuiteError; the refine step then splits the micro-batch until the rows that cause it are isolated.
"""

from __future__ import annotations

import functools
import logging
import types
import typing
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from streams.events import EVENT_TYPES, Event, field_types

if typing.TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
MAX_TEXT_CHARS = 200_000


# Content rules per kind: (column, min, max) for numbers; allowed values; which kinds refer to tasks.
RANGES: dict[str, list[tuple[str, float | None, float | None]]] = {
    "task": [("epoch", 0, None)],
    "rollout": [("epoch", 0, None), ("group_index", 0, None)],
    "reward": [("epoch", 0, None), ("reward", 0.0, 1.0)],
    "batch": [
        ("epoch", 0, None),
        ("p_hat", 0.0, 1.0),
        ("env_reward", 0.0, 1.0),
        ("weight", 0.0, None),
        ("n_tasks", 0, None),
        ("n_rollouts", 0, None),
        ("n_success", 0, None),
    ],
    "checkpoint": [("epoch", 0, None), ("version", 0, None)],
    "restart": [("epoch", 0, None), ("restart", 1, None)],
    "reassign": [("epoch", 0, None), ("rollouts_missing", 1, None), ("held_s", 0.0, None), ("reassignment", 1, None)],
}
VALUE_SETS: dict[str, list[tuple[str, list]]] = {
    "batch": [("granularity", ["batch", "task", "level"])],
    "checkpoint": [("model_kind", ["agent", "env"])],
    "restart": [("role", ["simulator", "rollout", "reward", "train-agent", "train-env", "ingest"])],
}
REFERS_TO_TASK = {"rollout", "reward", "reassign"}
# The check a rollout or reward fails when its task has not landed (SuiteRunner.suite): the one failure the
# refiner undoes, re-admitting the row when its task lands (lake/refine.py).
LATE_CHECK = "expect_column_values_to_not_be_in_set(task_id)"


def late_only() -> pl.Expr:
    """Quarantine rows whose only failed check is LATE_CHECK: valid, but their task had not landed."""
    checks = pl.col("failed_checks")
    return (checks.list.len() == 1) & (checks.list.first() == LATE_CHECK)


ID_COLUMNS = {"event_id", "run_id", "task_id", "batch_id", "rollout_id", "producer", "domain", "worker"}


_DTYPES = {int: "int64", float: "float64", bool: "bool", str: object}


@functools.cache
def scalar_columns(kind: str) -> dict[str, object]:
    """The kind's scalar fields and their pandas dtypes (lists are not checked by a suite)."""
    columns = {}
    for name, annotation in field_types(EVENT_TYPES[kind]).items():
        optional = typing.get_origin(annotation) in (types.UnionType, typing.Union)
        if optional:
            (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) is list:
            continue
        columns[name] = "Int64" if optional and annotation is int else object if optional else _DTYPES[annotation]
    return columns


class SuiteError(RuntimeError):
    """An expectation could not be evaluated on a frame (not: some rows failed it)."""


def check_name(config) -> str:
    """ "<expectation type>(<column>)" for an expectation configuration."""
    return f"{config.type}({config.kwargs.get('column', '')})"


@dataclass
class Verdict:
    """Outcome of validating one frame: failed checks per row position, and counts per check."""

    rows: int
    failed: dict[int, list[str]] = field(default_factory=dict)
    unexpected_counts: Counter = field(default_factory=Counter)


class SuiteRunner:
    """Holds one ephemeral GX context; builds and runs the suites."""

    def __init__(self):
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import ProgressBarsConfig

        for name in ("great_expectations", "great_expectations.data_context.types.base"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.gx, self.gxe = gx, gxe
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = self.context.data_sources.add_pandas("genenv")
        self.batches = {}
        for kind in EVENT_TYPES:
            asset = source.add_dataframe_asset(kind)
            self.batches[kind] = asset.add_batch_definition_whole_dataframe(f"{kind}-microbatch")
        self.content = {kind: self._content_expectations(kind) for kind in EVENT_TYPES}

    # -- suites -------------------------------------------------------------------------------
    def _content_expectations(self, kind: str) -> list:
        gxe = self.gxe
        checks = [
            gxe.ExpectColumnValuesToBeBetween(column=column, min_value=low, max_value=high)
            for column, low, high in RANGES.get(kind, [])
        ]
        checks += [
            gxe.ExpectColumnValuesToBeInSet(column=column, value_set=allowed)
            for column, allowed in VALUE_SETS.get(kind, [])
        ]
        for name in scalar_columns(kind):
            if field_types(EVENT_TYPES[kind])[name] is str:
                limit = MAX_ID_CHARS if name in ID_COLUMNS else MAX_TEXT_CHARS
                checks.append(gxe.ExpectColumnValueLengthsToBeBetween(column=name, max_value=limit))
        return checks

    def suite(self, kind: str, unknown_task_ids: list[str] | None = None):
        """The kind's suite for one micro-batch: the content checks, and references to tasks."""
        checks = list(self.content[kind])
        if kind in REFERS_TO_TASK and unknown_task_ids:
            # "Refers to a known task", stated as "is none of this batch's unknown task ids": the same verdicts,
            # with a value set of a few ids instead of every id the lake knows (GX copies it on every access).
            checks.append(self.gxe.ExpectColumnValuesToNotBeInSet(column="task_id", value_set=unknown_task_ids))
        return self.gx.ExpectationSuite(name=f"genenv.{kind}", expectations=checks)

    # -- frames -------------------------------------------------------------------------------
    @staticmethod
    def frame(kind: str, events: list[Event]) -> pd.DataFrame:
        """A typed frame of the events' scalar fields (decoded events: every value has its field's type)."""
        import pandas as pd  # here, as GX is: of the processes that import the lake, only the ingestor validates

        columns = scalar_columns(kind)
        frame = pd.DataFrame(
            {name: pd.Series([getattr(e, name) for e in events], dtype=dtype) for name, dtype in columns.items()}
        )
        frame.index = pd.RangeIndex(len(frame))
        return frame

    def run(self, kind: str, frame: pd.DataFrame, suite) -> Verdict:
        verdict = Verdict(rows=len(frame))
        if frame.empty:
            return verdict
        batch = self.batches[kind].get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(suite, result_format={"result_format": "COMPLETE", "partial_unexpected_count": 0})
        order = {check_name(e.configuration): i for i, e in enumerate(suite.expectations)}
        for outcome in sorted(result.results, key=lambda o: order[check_name(o.expectation_config)]):
            if outcome.success:
                continue
            name = check_name(outcome.expectation_config)
            indices = outcome.result.get("unexpected_index_list")
            if indices is None:  # the expectation itself raised
                messages = {
                    i.get("exception_message") for i in (outcome.exception_info or {}).values() if isinstance(i, dict)
                } or {str(outcome.exception_info)}
                raise SuiteError(f"{name} could not be evaluated: {'; '.join(map(str, messages))}"[:500])
            verdict.unexpected_counts[name] += len(indices)
            for index in indices:
                verdict.failed.setdefault(int(index), []).append(name)
        return verdict
