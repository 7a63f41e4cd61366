"""`name=value` overrides onto config dataclasses, typed by the dataclass fields, with one-line errors."""

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


def apply_overrides(config, pairs: list[str]):
    """A copy of `config` with each `name=value` applied; unknown names and bad values raise OverrideError."""
    hints = typing.get_type_hints(type(config))
    names = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise OverrideError(f"{pair!r}: expected name=value")
        if name not in names:
            raise OverrideError(f"{name}: no such option for {type(config).__name__} "
                                f"(options: {', '.join(sorted(names))})")
        try:
            changes[name] = coerce(text.strip(), hints[name])
        except ValueError as exc:
            raise OverrideError(f"{name}={text}: {exc}") from None
    return dataclasses.replace(config, **changes)
