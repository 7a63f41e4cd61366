"""Great Expectations suites, one per event kind, and a runner that says which rows failed which check.

Each kind is validated in two passes over a pandas frame of object columns
(so that GX checks every value's Python type, not the column's dtype):

- shape:   required fields present (not null) and every field of its declared type;
- content: ids unique (a later copy of an id already in the batch or the lake fails),
           numbers in range (reward and p_hat in [0, 1], counts >= 0),
           text lengths bounded, and rollouts/rewards referring to known tasks.

Only rows that pass `shape` reach `content`, so range checks never meet a
string. A failing row is named by the checks it failed, as
"<expectation type>(<column>)", for example
"expect_column_values_to_be_between(reward)".
"""

from __future__ import annotations

import logging
import types
import typing
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from streams.events import EVENT_TYPES, field_types, required_fields

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
MAX_TEXT_CHARS = 200_000
ITEMS_SUFFIX = "__items_typed"
DUPLICATE = "duplicate_event_id"  # derived column: True when the id landed before (here or earlier)

# Content rules per kind: (column, min, max) for numbers, and which columns must be known task ids.
RANGES: dict[str, list[tuple[str, float | None, float | None]]] = {
    "task": [("epoch", 0, None)],
    "rollout": [("epoch", 0, None), ("group_index", 0, None)],
    "reward": [("epoch", 0, None), ("reward", 0.0, 1.0)],
    "batch": [
        ("epoch", 0, None), ("p_hat", 0.0, 1.0), ("env_reward", 0.0, 1.0), ("weight", 0.0, None),
        ("n_tasks", 0, None), ("n_rollouts", 0, None), ("n_success", 0, None),
    ],
    "checkpoint": [("epoch", 0, None), ("version", 0, None)],
}
VALUE_SETS: dict[str, list[tuple[str, list]]] = {
    "batch": [("granularity", ["batch", "task"])],
    "checkpoint": [("model_kind", ["agent", "env"])],
}
REFERS_TO_TASK = {"rollout", "reward"}
ID_COLUMNS = {"event_id", "run_id", "task_id", "batch_id", "rollout_id", "producer", "schema", "domain"}


def _gx_type_names(annotation) -> tuple[list[str], bool]:
    """GX type names for a field annotation, and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _gx_type_names(inner)
    if origin is list:
        return ["list"], True
    return {str: ["str"], int: ["int"], float: ["float", "int"], bool: ["bool"]}[annotation], False


def _items_typed(value, annotation) -> bool | None:
    if not isinstance(value, list):
        return None  # the type check on the column itself reports it
    (item,) = typing.get_args(annotation)
    if item is float:
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if item is int:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return all(isinstance(v, item) for v in value)


def check_name(config) -> str:
    """"<expectation type>(<column>)" for an expectation configuration."""
    return f"{config.type}({config.kwargs.get('column', '')})"


@dataclass
class Verdict:
    """Outcome of validating one frame: failed checks per row position, and counts per check."""

    rows: int
    failed: dict[int, list[str]] = field(default_factory=dict)
    unexpected_counts: Counter = field(default_factory=Counter)

    @property
    def passed(self) -> int:
        return self.rows - len(self.failed)


class SuiteRunner:
    """Holds one ephemeral GX context; builds and runs the suites."""

    def __init__(self):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        for name in ("great_expectations", "great_expectations.data_context.types.base"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.gx = gx
        import great_expectations.expectations as gxe

        self.gxe = gxe
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = self.context.data_sources.add_pandas("genenv")
        self.batches = {}
        for kind in EVENT_TYPES:
            asset = source.add_dataframe_asset(kind)
            self.batches[kind] = asset.add_batch_definition_whole_dataframe(f"{kind}-microbatch")
        self.shape_suites = {kind: self._shape_suite(kind) for kind in EVENT_TYPES}

    # -- suites -------------------------------------------------------------------------------
    def _shape_suite(self, kind: str):
        gxe = self.gxe
        cls = EVENT_TYPES[kind]
        suite = self.gx.ExpectationSuite(name=f"genenv.{kind}.shape")
        for name in required_fields(cls) + ["event_id", "schema"]:
            suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=name))
        for name, annotation in field_types(cls).items():
            type_names, is_list = _gx_type_names(annotation)
            suite.add_expectation(gxe.ExpectColumnValuesToBeInTypeList(column=name, type_list=type_names))
            if is_list:
                suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=name + ITEMS_SUFFIX, value_set=[True]))
        return suite

    def content_suite(self, kind: str, known_task_ids: list[str] | None):
        gxe = self.gxe
        suite = self.gx.ExpectationSuite(name=f"genenv.{kind}.content")
        # Not ExpectColumnValuesToBeUnique: it would also reject the first occurrence, which is legitimate.
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=DUPLICATE, value_set=[False]))
        for column, low, high in RANGES.get(kind, []):
            suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=low, max_value=high))
        for column, allowed in VALUE_SETS.get(kind, []):
            suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=allowed))
        for name, annotation in field_types(EVENT_TYPES[kind]).items():
            if _gx_type_names(annotation)[0] == ["str"]:
                limit = MAX_ID_CHARS if name in ID_COLUMNS else MAX_TEXT_CHARS
                suite.add_expectation(gxe.ExpectColumnValueLengthsToBeBetween(column=name, max_value=limit))
        if kind in REFERS_TO_TASK:
            # The set is the intersection of the batch's task ids with the known ones: same verdicts, small config.
            suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="task_id", value_set=known_task_ids or []))
        return suite

    # -- frames -------------------------------------------------------------------------------
    @staticmethod
    def frame(kind: str, payloads: list[dict]) -> pd.DataFrame:
        """Object-typed frame with one column per field (absent -> None) plus the list item checks."""
        hints = field_types(EVENT_TYPES[kind])
        columns = {name: [p.get(name) for p in payloads] for name in hints}
        for name, annotation in hints.items():
            if _gx_type_names(annotation)[1]:
                columns[name + ITEMS_SUFFIX] = [_items_typed(v, annotation) for v in columns[name]]
        frame = pd.DataFrame(columns, dtype=object)
        frame.index = pd.RangeIndex(len(frame))
        return frame

    def run(self, kind: str, frame: pd.DataFrame, suite) -> Verdict:
        verdict = Verdict(rows=len(frame))
        if frame.empty:
            return verdict
        batch = self.batches[kind].get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(suite, result_format={"result_format": "COMPLETE", "partial_unexpected_count": 0})
        for outcome in result.results:
            if outcome.success:
                continue
            name = check_name(outcome.expectation_config)
            indices = outcome.result.get("unexpected_index_list")
            if indices is None:  # the expectation itself raised: every row is suspect
                messages = {i.get("exception_message") for i in (outcome.exception_info or {}).values()
                            if isinstance(i, dict)} or {str(outcome.exception_info)}
                raise RuntimeError(f"{name} could not be evaluated: {'; '.join(map(str, messages))}")
            verdict.unexpected_counts[name] += len(indices)
            for index in indices:
                verdict.failed.setdefault(int(index), []).append(name)
        return verdict
