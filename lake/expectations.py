"""Great Expectations suites, one per event kind, and a runner that says which rows failed which check.

A kind's suite checks, over a pandas frame of object columns (so that GX checks
every value's Python type, not the column's dtype):

- shape:   required fields present (not null) and every field of its declared type
           (list fields: the list and its items);
- content: ids unique (a later copy of an id already in the batch or the lake fails),
           numbers in range (reward and p_hat in [0, 1], counts >= 0),
           text lengths bounded, and rollouts/rewards referring to known tasks.

Range checks carry the row condition `well_typed == True`, so a string where a
number belongs is reported by the type check instead of breaking the range
check; one validation run covers both. (Length checks need no condition: GX
measures non-strings as missing, and the type check reports them.) A
failing row is named by the checks it failed, in suite order, as
"<expectation type>(<column>)", e.g. "expect_column_values_to_be_between(reward)".
"""

from __future__ import annotations

import functools
import logging
import types
import typing
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from streams.events import EVENT_TYPES, field_types, matches_type, required_fields

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
MAX_TEXT_CHARS = 200_000
ITEMS_SUFFIX = "__items_typed"
DUPLICATE = "duplicate_event_id"  # derived column: True when the id landed before (here or earlier)
WELL_TYPED = "well_typed"  # derived column: every present value has its declared type


# Content rules per kind: (column, min, max) for numbers; allowed values; which kinds refer to tasks.
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


@dataclass(frozen=True)
class FieldSpec:
    """How one event field is checked."""

    annotation: object  # the declared type, without Optional
    gx_types: tuple[str, ...]  # type names for ExpectColumnValuesToBeInTypeList
    exact: tuple[type, ...]  # Python types its JSON values may have (bool is no int here)
    numpy: str | None  # dtype for a column whose values all have an exact type (GX checks the dtype once)

    @property
    def is_list(self) -> bool:
        return self.gx_types == ("list",)


_SCALARS = {
    str: (("str",), (str,), None),
    int: (("int",), (int,), "int64"),
    float: (("float", "int"), (float, int), "float64"),
    bool: (("bool",), (bool,), "bool"),
}


@functools.cache
def field_specs(kind: str) -> dict[str, FieldSpec]:
    specs = {}
    for name, annotation in field_types(EVENT_TYPES[kind]).items():
        if typing.get_origin(annotation) in (types.UnionType, typing.Union):
            (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) is list:
            specs[name] = FieldSpec(annotation, ("list",), (list,), None)
        else:
            specs[name] = FieldSpec(annotation, *_SCALARS[annotation])
    return specs


def check_name(config) -> str:
    """"<expectation type>(<column>)" for an expectation configuration."""
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
        from great_expectations.data_context.types.base import ProgressBarsConfig

        for name in ("great_expectations", "great_expectations.data_context.types.base"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.gx = gx
        import great_expectations.expectations as gxe

        self.gxe = gxe
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        from great_expectations.expectations.row_conditions import Column

        self.typed_rows = {"row_condition": Column(WELL_TYPED) == True}  # noqa: E712 (a GX condition, not a test)
        source = self.context.data_sources.add_pandas("genenv")
        self.batches = {}
        for kind in EVENT_TYPES:
            asset = source.add_dataframe_asset(kind)
            self.batches[kind] = asset.add_batch_definition_whole_dataframe(f"{kind}-microbatch")
        self.shape = {kind: self._shape_expectations(kind) for kind in EVENT_TYPES}

    # -- suites -------------------------------------------------------------------------------
    def _shape_expectations(self, kind: str) -> list:
        gxe = self.gxe
        cls = EVENT_TYPES[kind]
        checks = [gxe.ExpectColumnValuesToNotBeNull(column=name) for name in (*required_fields(cls), "event_id", "schema")]
        for name, spec in field_specs(kind).items():
            checks.append(gxe.ExpectColumnValuesToBeInTypeList(column=name, type_list=list(spec.gx_types)))
            if spec.is_list:
                checks.append(gxe.ExpectColumnValuesToBeInSet(column=name + ITEMS_SUFFIX, value_set=[True]))
        return checks

    def suite(self, kind: str, unknown_task_ids: list[str] | None = None):
        """The kind's suite for one micro-batch: shape checks, then content checks."""
        gxe = self.gxe
        checks = list(self.shape[kind])
        # Not ExpectColumnValuesToBeUnique: it would also reject the first occurrence, which is legitimate.
        checks.append(gxe.ExpectColumnValuesToBeInSet(column=DUPLICATE, value_set=[False]))
        for column, low, high in RANGES.get(kind, []):
            checks.append(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=low, max_value=high, **self.typed_rows))
        for column, allowed in VALUE_SETS.get(kind, []):
            checks.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=allowed))
        for name, spec in field_specs(kind).items():
            if spec.annotation is str:
                limit = MAX_ID_CHARS if name in ID_COLUMNS else MAX_TEXT_CHARS
                checks.append(gxe.ExpectColumnValueLengthsToBeBetween(column=name, max_value=limit))
        if kind in REFERS_TO_TASK and unknown_task_ids:
            # "Refers to a known task", stated as "is none of this batch's unknown task ids": the same verdicts,
            # with a value set of a few ids instead of every id the lake knows (GX copies it on every access).
            checks.append(gxe.ExpectColumnValuesToNotBeInSet(column="task_id", value_set=unknown_task_ids))
        return self.gx.ExpectationSuite(name=f"genenv.{kind}", expectations=checks)

    # -- frames -------------------------------------------------------------------------------
    @staticmethod
    def frame(kind: str, payloads: list[dict], duplicate: list[bool]) -> pd.DataFrame:
        """Object-typed frame with one column per field (absent -> None) and the derived check columns."""
        specs = field_specs(kind)
        columns = {name: [p.get(name) for p in payloads] for name in specs}
        for name, spec in specs.items():
            if spec.is_list:
                columns[name + ITEMS_SUFFIX] = [
                    matches_type(v, spec.annotation) if isinstance(v, list) else None for v in columns[name]
                ]
        columns[WELL_TYPED] = [
            all(v is None or k not in specs or type(v) in specs[k].exact for k, v in p.items()) for p in payloads
        ]
        columns[DUPLICATE] = duplicate
        frame = pd.DataFrame(columns, dtype=object)
        for name, spec in specs.items():
            if spec.numpy and all(type(v) in spec.exact for v in columns[name]):
                frame[name] = frame[name].astype(spec.numpy)
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
            if indices is None:  # the expectation itself raised: every row is suspect
                messages = {i.get("exception_message") for i in (outcome.exception_info or {}).values()
                            if isinstance(i, dict)} or {str(outcome.exception_info)}
                raise RuntimeError(f"{name} could not be evaluated: {'; '.join(map(str, messages))}")
            verdict.unexpected_counts[name] += len(indices)
            for index in indices:
                verdict.failed.setdefault(int(index), []).append(name)
        return verdict
