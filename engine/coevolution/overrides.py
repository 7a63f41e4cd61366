"""Overrides onto config dataclasses, typed by the dataclass fields, with one-line errors: `name=value` text from
the command line, or values a TOML file already typed (taken as they are, so every string round-trips)."""

from __future__ import annotations

import dataclasses
import types
import typing


class OverrideError(ValueError):
    pass


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
    if annotation in (int, float, str):
        return annotation(text)
    raise ValueError(f"cannot set a {annotation} from the command line")


def typed(value, annotation):
    """A TOML value as the field's type: text is parsed (`coerce`); a bool, int, float or list is checked."""
    if isinstance(value, str):
        return coerce(value, annotation)
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (types.UnionType, typing.Union):
        return typed(value, args[0])
    if origin is tuple and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"expected {getattr(annotation, '__name__', annotation)}, got {type(value).__name__}")


def apply_values(config, values: dict):
    """A copy of `config` with each name set to its value (text or TOML-typed); unknown names and bad values raise
    OverrideError."""
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
            changes[name] = typed(value, hints[name])
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
    return apply_values(config, dict(parse_pairs(pairs)))
