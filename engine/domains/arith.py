"""arith: two whole numbers and one operation; exact numeric match. The fastest domain, for tests.

The simulator chooses the numbers and the wording; the parser reads exactly two whole numbers and
one operation from the text and computes the answer itself. Difficulty: digits of the larger
number, the operation (0 +, 1 -, 2 x) and the words in the question.
"""

from __future__ import annotations

import random
import re

from .base import Invalid, SimulatorRequest, Task, Verdict, example_summary

OPERATIONS = {  # family -> words and symbols that name it
    "+": ("plus", "sum", "add", "added", "total", "+"),
    "-": ("minus", "difference", "subtract", "subtracted", "take away", "-"),
    "*": ("times", "product", "multiply", "multiplied", "×", "*"),
}
OP_INDEX = {"+": 0, "-": 1, "*": 2}
TEMPLATES = {
    "+": ("What is {a} plus {b}?", "What is the sum of {a} and {b}?", "Add {a} and {b}. What do you get?"),
    "-": ("What is {a} minus {b}?", "What is the difference of {a} and {b}?", "Subtract {b} from {a}. What is left?"),
    "*": ("What is {a} times {b}?", "What is the product of {a} and {b}?", "Multiply {a} by {b}. What is the result?"),
}
HELD_OUT_TEMPLATE = {"+": "Calculate {a} + {b}.", "-": "Calculate {a} - {b}.", "*": "Calculate {a} * {b}."}
NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.]*\d)")
ANSWER = re.compile(r"-?\d[\d,]*")


def compute(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


class Arith:
    name = "arith"
    agent_system = "You are a careful calculator. Reply with the number only."
    difficulty_feature = "digits"

    def simulator_request(self, rng: random.Random, performance: str) -> SimulatorRequest:
        return SimulatorRequest(
            "Write one arithmetic question about two whole numbers (a sum, a difference or a product). "
            f"The student's recent results: {performance}. Write only the question."
        )

    def parse(self, generation: str, context: dict) -> Task | Invalid:
        text = generation.strip().split("\n")[0].strip()
        if not 8 <= len(text) <= 200:
            return Invalid(f"length: the question has {len(text)} characters, expected 8 to 200")
        numbers = NUMBER.findall(text)
        if len(numbers) != 2:
            return Invalid(f"numbers: expected 2 whole numbers, found {len(numbers)}")
        if any(len(n) > 6 for n in numbers):
            return Invalid("numbers: more than 6 digits")
        lowered = text.lower()
        families = [
            op
            for op, words in OPERATIONS.items()
            if any((w in lowered) if not w.isalpha() else re.search(rf"\b{w}\b", lowered) for w in words)
        ]
        if len(families) != 1:
            return Invalid(f"operation: expected one of sum/difference/product, found {len(families) or 'none'}")
        op = families[0]
        a, b = int(numbers[0]), int(numbers[1])
        if op == "-" and re.search(r"\bsubtract\b", lowered) and re.search(r"\bfrom\b", lowered):
            a, b = b, a  # "subtract b from a"
        return self._task(text, op, a, b)

    def _task(self, text: str, op: str, a: int, b: int) -> Task:
        difficulty = {"digits": max(len(str(a)), len(str(b))), "operation": OP_INDEX[op], "words": len(text.split())}
        return Task(prompt=text, reference=compute(op, a, b), difficulty=difficulty)

    def seeds(self, rng: random.Random, n: int) -> list[tuple[SimulatorRequest, str, Task]]:
        out = []
        for _ in range(n):
            op = rng.choice("+-*")
            digits = rng.choice((1, 1, 2, 2, 3)) if op != "*" else rng.choice((1, 1, 2))
            a, b = number(rng, digits), number(rng, rng.randint(1, digits))
            text = rng.choice(TEMPLATES[op]).format(a=a, b=b)
            out.append(
                (
                    self.simulator_request(rng, example_summary(rng, self.difficulty_feature, [1, 2, 3])),
                    text,
                    self.parse(text, {}),
                )
            )
        return out

    def reference_answer(self, task: Task) -> str:
        return str(task.reference)

    def agent_prompt(self, task: Task) -> str:
        return f"{task.prompt}\nReply with the number only."

    def check(self, task: Task, answer: str) -> Verdict:
        match = ANSWER.search(answer)
        if match is None:
            return Verdict(0.0, False, "no number in the answer")
        value = int(match.group().replace(",", ""))
        ok = value == task.reference
        return Verdict(float(ok), ok, f"answered {value}, expected {task.reference}")

    def validation_set(self, n: int) -> list[Task]:
        rng = random.Random(0xA417)  # its own stream: never the seeds' or the simulator's
        tasks = []
        for i in range(n):
            op = "+-*"[i % 3]
            digits = 1 + (i // 3) % 2
            a, b = number(rng, digits), number(rng, digits)
            tasks.append(self._task(HELD_OUT_TEMPLATE[op].format(a=a, b=b), op, a, b))
        return tasks
