"""Domains as plug-ins: each owns its seeds, prompts, parser and checker (see base.py)."""

from .arith import Arith
from .base import Domain, Invalid, SimulatorRequest, Task, Verdict, performance_summary, task_from_row, task_to_json
from .qa import QA
from .toolcall import ToolCall

DOMAINS: dict[str, type] = {"arith": Arith, "toolcall": ToolCall, "qa": QA}


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}; domains: {', '.join(DOMAINS)}")
    return DOMAINS[name]()


__all__ = ["DOMAINS", "Domain", "Invalid", "SimulatorRequest", "Task", "Verdict", "get_domain", "performance_summary",
           "task_from_row", "task_to_json"]
