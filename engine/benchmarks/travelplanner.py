"""TravelPlanner (Xie et al., 2024), sole-planning mode on the 45 train queries with full reference information.

The agent gets the query and its reference information (flights, driving, restaurants, attractions,
accommodations) and writes a day-by-day plan: a list of {days, current_city, transportation, breakfast,
attraction, lunch, dinner, accommodation}, as the data's example plans are written.

Metrics, as the paper defines them:
- delivery rate: share of queries with a plan that can be read;
- commonsense pass rate, micro (passed checks / all checks, over all queries, an undelivered plan failing
  every check) and macro (share of queries passing every check); the eight checks: within sandbox,
  complete information, within current city, reasonable city route, diverse restaurants, diverse
  attractions, non-conflicting transportation, minimum nights stay;
- hard-constraint pass rate, micro and macro, over the constraints each query states: budget (always), room
  rule, room type, cuisine, transportation; evaluated only for plans that are complete and within the
  sandbox (otherwise they fail), as the official evaluator does;
- final pass rate: share of queries whose plan passes every commonsense check and every hard constraint.

What differs from the official evaluator (evaluation/ in OSU-NLP-Group/TravelPlanner):
- The checks run on each query's reference information (train_ref_info.jsonl), not on the full database:
  the flights table is not available offline. A flight, restaurant, attraction or stay is "in the sandbox"
  when the query's reference information lists it.
- The structured query fields (origin, destinations, days, people, budget, local constraints) are not in
  the data: origin and destinations are read from the reference information's keys, the rest from the
  query's text with patterns covering the train queries' phrasings (`parse_query`).
- Complete information: every day is present, every travel day has transportation, every day but the last
  has accommodation, and at most half of the meal and attraction fields are empty ('-').
Plans are read as literals (`ast.literal_eval`), never run.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from .base import Ask, Benchmark, DataMissing, Item, ItemResult, limited, mean

COMMONSENSE = (
    "within_sandbox",
    "complete_information",
    "within_current_city",
    "reasonable_city_route",
    "diverse_restaurants",
    "diverse_attractions",
    "non_conflicting_transportation",
    "minimum_nights_stay",
)
HARD = ("budget", "room_rule", "room_type", "cuisine", "transportation")
CUISINES = ("American", "Chinese", "Italian", "Mexican", "Indian", "Mediterranean", "French")
NUMBERS = {
    "one": 1,
    "single": 1,
    "solo": 1,
    "alone": 1,
    "two": 2,
    "pair": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
}
ROOM_RULES = {
    "parties": r"\bparties\b",
    "smoking": r"smoking",
    "children under 10": r"children under",
    "pets": r"\bpet",
    "visitors": r"visitors",
}
ROOM_TYPES = {
    "entire room": r"entire room",
    "private room": r"private room",
    "shared room": r"(?<!not )shared room",
    "not shared room": r"not shared room",
}
ROOM_TYPE_VALUE = {"entire room": "Entire home/apt", "private room": "Private room", "shared room": "Shared room"}
MEALS = ("breakfast", "lunch", "dinner")


# -- the query -----------------------------------------------------------------------------------------
def parse_query(query: str, reference: dict) -> dict:
    """The query's fields: org and dest from the reference information, the rest from the text."""
    text = query.lower()
    moves = [k for k in reference if k.startswith(("Flight from ", "Self-driving from ", "Taxi from "))]
    first = re.match(r"\w[\w-]* from (.+?) to (.+?)(?: on \d{4}-\d\d-\d\d)?$", moves[0]) if moves else None
    org = city(first.group(1)) if first else ""
    dest = [city(k[len("Attractions in ") :]) for k in reference if k.startswith("Attractions in ")]
    days = 7 if re.search(r"\bweek", text) else None
    match = re.search(r"\b(\d+|three|five|seven)[- ]days?\b", text)
    if days is None and match:
        days = int(match.group(1)) if match.group(1).isdigit() else {"three": 3, "five": 5, "seven": 7}[match.group(1)]
    people = 1
    match = re.search(
        r"(?:group of|party of|for|a group of)\s+(\d+|two|three|four|five|six|seven|eight)\b(?! days?| cities)", text
    )
    if match:
        people = int(match.group(1)) if match.group(1).isdigit() else NUMBERS[match.group(1)]
    elif re.search(r"\b(\d+|two|three|four|five|six|seven|eight) (?:people|individuals|persons)\b", text):
        word = re.search(r"\b(\d+|two|three|four|five|six|seven|eight) (?:people|individuals|persons)\b", text).group(1)
        people = int(word) if word.isdigit() else NUMBERS[word]
    elif re.search(r"\b(for two|a pair|for a pair)\b", text):
        people = 2
    budget = int(re.search(r"\$([\d,]+)", query).group(1).replace(",", "")) if "$" in query else None
    local = {
        "house rule": next((rule for rule, pattern in ROOM_RULES.items() if re.search(pattern, text)), None),
        "room type": next(
            (
                kind
                for kind, pattern in sorted(ROOM_TYPES.items(), key=lambda kv: -len(kv[0]))
                if re.search(pattern, text)
            ),
            None,
        ),
        "cuisine": [c for c in CUISINES if c.lower() in text] or None,
        "transportation": (
            "no flight"
            if re.search(r"(no|not|avoid)[\w\s-]{0,30}(flight|flying)", text)
            else "no self-driving"
            if re.search(r"(non-self-driv|not[\w\s']{0,20}(self-drive|self-driv|drive))", text)
            else None
        ),
    }
    if re.search(r"no specific (preferences|accommodation restrictions)", text) and not local["cuisine"]:
        local["house rule"] = local["room type"] = None
    return {
        "org": org,
        "dest": dest,
        "days": days or {1: 3, 2: 5, 3: 7}.get(len(dest), 3),
        "visiting_city_number": {3: 1, 5: 2, 7: 3}.get(days or 3, len(dest)),
        "people_number": people,
        "budget": budget,
        "local_constraint": local,
    }


# -- the reference information ------------------------------------------------------------------------
class Sandbox:
    """Lookups into one query's reference information."""

    def __init__(self, reference: dict):
        self.flights = {
            f["Flight Number"]: f
            for k, v in reference.items()
            if k.startswith("Flight from ") and isinstance(v, list)
            for f in v
        }
        self.restaurants, self.attractions, self.stays, self.drives = {}, {}, {}, {}
        for key, value in reference.items():
            if not isinstance(value, list):
                if key.startswith(("Self-driving from ", "Taxi from ")) and "No valid information" not in value:
                    self.drives[key] = value
                continue
            where = city(key.split(" in ", 1)[-1])
            if key.startswith("Restaurants in "):
                self.restaurants.update({(str(r["Name"]).strip(), where): r for r in value})
            elif key.startswith("Attractions in "):
                self.attractions.update({(str(a["Name"]).strip(), where): a for a in value})
            elif key.startswith("Accommodations in "):
                self.stays.update({(str(a["NAME"]).strip(), where): a for a in value})

    def drive(self, mode: str, origin: str, destination: str) -> str | None:
        return next(
            (
                v
                for k, v in self.drives.items()
                if k.startswith(mode) and cities_of(k.split(" ", 1)[1]) == [origin, destination]
            ),
            None,
        )


def city(text: str) -> str:
    """A city as the plans write it, without the state in parentheses: 'San Antonio(Texas)' -> 'San Antonio'."""
    return re.sub(r"\(.*?\)", "", text).strip()


def name_and_city(entry: str) -> tuple[str, str]:
    """'Name, City' -> (name, city); the name may hold commas, the city is after the last one."""
    name, _, where = entry.strip().rpartition(",")
    return (name.strip(), city(where)) if name else (entry.strip(), "")


def cities_of(current_city: str) -> list[str]:
    match = re.match(r"from (.+?) to (.+)$", current_city.strip())
    return [city(match.group(1)), city(match.group(2))] if match else [city(current_city)]


def empty(value) -> bool:
    return value is None or str(value).strip() in ("", "-")


def read_plan(response: str) -> list[dict] | None:
    start, end = response.find("["), response.rfind("]")
    if start < 0 or end <= start:
        return None
    text = response[start : end + 1]
    for reader in (ast.literal_eval, json.loads):
        try:
            plan = reader(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(plan, list):
            days = [d for d in plan if isinstance(d, dict) and d]
            if days and all("current_city" in d for d in days):
                return days
    return None


# -- the checks ---------------------------------------------------------------------------------------
def transport_mode(text: str) -> str | None:
    if empty(text):
        return None
    lowered = text.lower()
    return (
        "flight"
        if "flight" in lowered
        else "self-driving"
        if "self-driving" in lowered
        else "taxi"
        if "taxi" in lowered
        else "other"
    )


def commonsense(plan: list[dict], query: dict, box: Sandbox) -> dict[str, bool]:
    meals = [(day, day.get(m)) for day in plan for m in MEALS if not empty(day.get(m))]
    attractions = [
        (day, a)
        for day in plan
        if not empty(day.get("attraction"))
        for a in str(day["attraction"]).split(";")
        if a.strip()
    ]
    stays = [(day, day.get("accommodation")) for day in plan if not empty(day.get("accommodation"))]

    def in_sandbox() -> bool:
        for day in plan:
            moving = day.get("transportation")
            mode = transport_mode(moving)
            if mode == "flight":
                numbers = re.findall(r"F\d+", str(moving))
                if not numbers or any(n not in box.flights for n in numbers):
                    return False
            elif mode in ("self-driving", "taxi"):
                route = cities_of(str(day.get("current_city", "")))
                if len(route) != 2 or box.drive("Self-driving" if mode == "self-driving" else "Taxi", *route) is None:
                    return False
        return (
            all(name_and_city(m) in box.restaurants for _, m in meals)
            and all(name_and_city(a) in box.attractions for _, a in attractions)
            and all(name_and_city(s) in box.stays for _, s in stays)
        )

    def complete() -> bool:
        if len(plan) != query["days"]:
            return False
        for i, day in enumerate(plan):
            if "from " in str(day.get("current_city", "")) and empty(day.get("transportation")):
                return False
            if i < len(plan) - 1 and empty(day.get("accommodation")):
                return False
        fields = [day.get(k) for day in plan for k in (*MEALS, "attraction")]
        return sum(empty(v) for v in fields) <= len(fields) / 2

    def in_current_city() -> bool:
        for day in plan:
            here = cities_of(str(day.get("current_city", "")))
            entries = (
                [day.get(m) for m in MEALS] + str(day.get("attraction") or "").split(";") + [day.get("accommodation")]
            )
            if any(not empty(e) and name_and_city(str(e))[1] not in here for e in entries if str(e).strip()):
                return False
        return True

    def route() -> bool:
        cities = [c for day in plan for c in cities_of(str(day.get("current_city", "")))]
        first, last = cities_of(str(plan[0].get("current_city", ""))), cities_of(str(plan[-1].get("current_city", "")))
        if len(first) != 2 or first[0] != query["org"] or len(last) != 2 or last[1] != query["org"]:
            return False
        visited = {c for c in cities if c != query["org"]}
        return visited <= set(query["dest"]) and len(visited) == query["visiting_city_number"]

    def diverse(entries) -> bool:
        keys = [name_and_city(str(e)) for _, e in entries]
        return len(keys) == len(set(keys))

    def transport_ok() -> bool:
        modes = {transport_mode(day.get("transportation")) for day in plan} - {None}
        return not ({"flight", "self-driving"} <= modes or {"taxi", "self-driving"} <= modes)

    def minimum_nights() -> bool:
        runs: list[list] = []
        for day in plan[:-1]:
            stay = day.get("accommodation")
            if empty(stay):
                continue
            if runs and runs[-1][0] == stay:
                runs[-1][1] += 1
            else:
                runs.append([stay, 1])
        for stay, nights in runs:
            record = box.stays.get(name_and_city(str(stay)))
            if record is not None and nights < float(record.get("minimum nights") or 1):
                return False
        return True

    return {
        "within_sandbox": in_sandbox(),
        "complete_information": complete(),
        "within_current_city": in_current_city(),
        "reasonable_city_route": route(),
        "diverse_restaurants": diverse(meals),
        "diverse_attractions": diverse(attractions),
        "non_conflicting_transportation": transport_ok(),
        "minimum_nights_stay": minimum_nights(),
    }


def plan_cost(plan: list[dict], query: dict, box: Sandbox) -> float:
    people = query["people_number"]
    total = 0.0
    for day in plan:
        moving = day.get("transportation")
        mode = transport_mode(moving)
        if mode == "flight":
            total += sum(box.flights[n]["Price"] for n in re.findall(r"F\d+", str(moving)) if n in box.flights) * people
        elif mode in ("self-driving", "taxi"):
            route = cities_of(str(day.get("current_city", "")))
            info = box.drive("Self-driving" if mode == "self-driving" else "Taxi", *route) if len(route) == 2 else None
            cost = re.search(r"cost: ([\d.]+)", info or "")
            if cost:
                total += float(cost.group(1)) * math.ceil(people / (5 if mode == "self-driving" else 4))
        for meal in MEALS:
            record = box.restaurants.get(name_and_city(str(day.get(meal)))) if not empty(day.get(meal)) else None
            if record:
                total += record["Average Cost"] * people
        stay = (
            box.stays.get(name_and_city(str(day.get("accommodation")))) if not empty(day.get("accommodation")) else None
        )
        if stay:
            total += stay["price"] * math.ceil(people / max(1, int(stay.get("maximum occupancy") or 1)))
    return total


def hard_constraints(plan: list[dict], query: dict, box: Sandbox) -> dict[str, bool]:
    local = query["local_constraint"]
    stays = [
        box.stays.get(name_and_city(str(d.get("accommodation")))) for d in plan if not empty(d.get("accommodation"))
    ]
    stays = [s for s in stays if s]
    out = {"budget": query["budget"] is None or plan_cost(plan, query, box) <= query["budget"]}
    if local["house rule"]:
        out["room_rule"] = all(f"no {local['house rule']}" not in str(s.get("house_rules", "")).lower() for s in stays)
    if local["room type"]:
        if local["room type"] == "not shared room":
            out["room_type"] = all(s.get("room type") != "Shared room" for s in stays)
        else:
            out["room_type"] = all(s.get("room type") == ROOM_TYPE_VALUE[local["room type"]] for s in stays)
    if local["cuisine"]:
        served = set()
        for day in plan:
            for meal in MEALS:
                name, city = name_and_city(str(day.get(meal))) if not empty(day.get(meal)) else ("", "")
                record = box.restaurants.get((name, city))
                if record and city != query["org"]:
                    served |= {c.strip() for c in str(record.get("Cuisines", "")).split(",")}
        out["cuisine"] = set(local["cuisine"]) <= served
    if local["transportation"]:
        banned = "flight" if local["transportation"] == "no flight" else "self-driving"
        out["transportation"] = all(transport_mode(d.get("transportation")) != banned for d in plan)
    return out


class TravelPlanner(Benchmark):
    name = "travelplanner"
    source = (
        "travelplanner/std_travelplanner.jsonl and train_ref_info.jsonl from OSU-NLP-Group/TravelPlanner; "
        "see data/README.md"
    )
    headline = "final_pass_rate"
    scoring = "the paper's metrics on each query's reference information (see engine/benchmarks/travelplanner.py)"

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        queries_path = self.file(data, "travelplanner/std_travelplanner.jsonl")
        queries = self.records(queries_path, lines=True)
        references = self.records(self.file(data, "travelplanner/train_ref_info.jsonl"), lines=True)
        if len(queries) != len(references):
            raise DataMissing(
                f"{self.name}: {len(queries)} queries but {len(references)} reference records "
                "(std_travelplanner.jsonl and train_ref_info.jsonl must be line-aligned)"
            )
        items = []
        for i, (row, reference) in enumerate(zip(queries, references)):
            messages = self.messages(queries_path, i, row)
            query_text = messages["user"].split("Query:")[-1].strip()
            items.append(
                Item(
                    f"travelplanner-train-{i}",
                    f"{parse_query(query_text, reference)['days']}-day",
                    {
                        "system": messages["system"],
                        "user": messages["user"],
                        "query": query_text,
                        "reference": reference,
                        "plan": messages["assistant"],
                    },
                )
            )
        return limited(items, limit)

    def messages(self, path: Path, index: int, row: dict) -> dict[str, str]:
        """A query record's chat as role -> content, or DataMissing naming the record: it needs a system, a user and
        an assistant message (the plan), each with text."""
        chat = row.get("messages")
        if not isinstance(chat, list) or not all(isinstance(m, dict) for m in chat):
            raise DataMissing(f"{self.name}: {path} record {index}: messages must be a list of objects")
        messages = {m.get("role"): m.get("content") for m in chat}
        for role in ("system", "user", "assistant"):
            if not isinstance(messages.get(role), str):
                raise DataMissing(f"{self.name}: {path} record {index}: no {role} message with text content")
        return messages

    def ask(self, item: Item) -> Ask:
        return Ask(item.data["system"], item.data["user"], max_new_tokens=1024)

    def gold(self, item: Item) -> str:
        return item.data["plan"]

    def score(self, item: Item, response: str) -> ItemResult:
        query = parse_query(item.data["query"], item.data["reference"])
        plan = read_plan(response)
        if plan is None:
            return ItemResult(
                item.item_id,
                item.category,
                response,
                0.0,
                {
                    "delivered": 0.0,
                    "commonsense_passed": 0,
                    "commonsense_total": len(COMMONSENSE),
                    "hard_passed": 0,
                    "hard_total": 1 + sum(v is not None for v in query["local_constraint"].values()),
                },
                "no plan could be read",
            )
        box = Sandbox(item.data["reference"])
        common = commonsense(plan, query, box)
        if common["complete_information"] and common["within_sandbox"]:
            hard = hard_constraints(plan, query, box)
        else:  # the official evaluator checks hard constraints only on complete plans within the sandbox
            hard = dict.fromkeys(
                ["budget", *[HARD[1 + i] for i, v in enumerate(query["local_constraint"].values()) if v]], False
            )
        passed = all(common.values()) and all(hard.values())
        failed = [k for k, v in {**common, **hard}.items() if not v]
        return ItemResult(
            item.item_id,
            item.category,
            response,
            float(passed),
            {
                "delivered": 1.0,
                "commonsense_passed": sum(common.values()),
                "commonsense_total": len(common),
                "hard_passed": sum(hard.values()),
                "hard_total": len(hard),
                "commonsense_all": float(all(common.values())),
                "hard_all": float(all(hard.values())),
            },
            "passes every constraint" if passed else f"fails: {', '.join(failed)}",
        )

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        m = [r.metrics for r in results]

        def ratio(part: str, whole: str) -> float:
            total = sum(x[whole] for x in m)
            return round(sum(x[part] for x in m) / total, 4) if total else float("nan")

        return {
            "delivery_rate": mean([x["delivered"] for x in m]),
            "commonsense_micro": ratio("commonsense_passed", "commonsense_total"),
            "commonsense_macro": mean([x.get("commonsense_all", 0.0) for x in m]),
            "hard_micro": ratio("hard_passed", "hard_total"),
            "hard_macro": mean([x.get("hard_all", 0.0) for x in m]),
            "final_pass_rate": mean([r.score for r in results]),
            "items": len(results),
        }
