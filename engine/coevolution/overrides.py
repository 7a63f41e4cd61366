"""Overrides onto config dataclasses, typed by the dataclass fields, with one-line errors: `name=value` text from
the command line (parsed), or values a TOML file already typed (checked: a quoted "2" for a number is refused, as
TOML's inf and nan are; an unset optional is the text "none", which is how the run's recorded TOML writes it)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing


class OverrideError(ValueError):
    pass


MAX_INT = 2**31 - 1  # no count, size or seed of a run comes near it; 2**63 - 1 is a typo, not a setting


def checked_number(value):
    """An int or float that a run can use: finite, and an int within +-MAX_INT."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("expected a finite number")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise ValueError(f"expected a number of magnitude at most {MAX_INT}")
    return value


def coerce(text: str, annotation):
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (types.UnionType, typing.Union):
        if text.lower() in ("none", "null", ""):
            return None
        return coerce(text, args[0])
    if origin is typing.Literal:
        if text not in args:
            raise ValueError(f"expected one of {', '.join(map(str, args))}")
        return text
    if origin is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if annotation is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if annotation in (int, float):
        return checked_number(annotation(text))
    if annotation is str:
        return text
    raise ValueError(f"cannot set a {annotation} from the command line")


def typed(value, annotation, text: bool = False):
    """A value as the field's type. text: command-line text, parsed (`coerce`). Otherwise a TOML value: a bool, int,
    float or list is checked; a string is taken only where the field holds text (or "none" for an unset optional)."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if text:
        return coerce(value, annotation)
    if origin in (types.UnionType, typing.Union):
        if isinstance(value, str) and value.lower() in ("none", "null", ""):
            return None
        return typed(value, args[0])
    if isinstance(value, str):
        if annotation in (int, float, bool):
            raise ValueError(f"expected {annotation.__name__}, got the text {value!r} (write it without quotes)")
        return coerce(value, annotation)
    if origin is tuple and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return checked_number(value)
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return checked_number(float(value))
    raise ValueError(f"expected {getattr(annotation, '__name__', annotation)}, got {type(value).__name__}")


def apply_values(config, values: dict, text: bool = False):
    """A copy of `config` with each name set to its value (command-line text when `text`, else TOML-typed); unknown
    names and bad values raise OverrideError."""
    hints = typing.get_type_hints(type(config))
    names = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for name, value in values.items():
        name = name.strip().replace("-", "_")
        if name not in names:
            raise OverrideError(
                f"{name}: no such option for {type(config).__name__} (options: {', '.join(sorted(names))})"
            )
        try:
            changes[name] = typed(value, hints[name], text)
        except ValueError as exc:
            raise OverrideError(f"{name}={value}: {exc}") from None
    return dataclasses.replace(config, **changes)


def parse_pairs(pairs: list[str]) -> list[tuple[str, str]]:
    """`name=value` strings as (name, value) text, trimmed."""
    parsed = []
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise OverrideError(f"{pair!r}: expected name=value")
        parsed.append((name.strip(), text.strip()))
    return parsed


def apply_overrides(config, pairs: list[str]):
    """A copy of `config` with each `name=value` applied; unknown names and bad values raise OverrideError."""
    return apply_values(config, dict(parse_pairs(pairs)), text=True)
