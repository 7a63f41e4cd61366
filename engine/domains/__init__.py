"""Domains as plug-ins: each owns its seeds, prompts, parser and checker (see base.py)."""

from .arith import Arith
from .base import (
    Domain,
    Invalid,
    SimulatorRequest,
    Task,
    Verdict,
    multi_turn,
    performance_summary,
    task_from_row,
    task_to_json,
)
from .qa import QA
from .toolcall import ToolCall
from .world import World

DOMAINS: dict[str, type] = {"arith": Arith, "toolcall": ToolCall, "qa": QA, "world": World}


def get_domain(name: str, seeds_path: str = "") -> Domain:
    """A domain by name; seeds_path: a file of seed tasks for domains that read one (toolcall: API-Bank)."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}; domains: {', '.join(DOMAINS)}")
    if seeds_path:
        if name != "toolcall":
            raise ValueError(f"seeds_path is read by the toolcall domain only, not {name}")
        return DOMAINS[name](seeds_path)
    return DOMAINS[name]()


__all__ = [
    "DOMAINS",
    "Domain",
    "Invalid",
    "SimulatorRequest",
    "Task",
    "Verdict",
    "get_domain",
    "multi_turn",
    "performance_summary",
    "task_from_row",
    "task_to_json",
]
