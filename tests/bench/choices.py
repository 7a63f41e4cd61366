"""Probe: how likely each toolcall simulator checkpoint of a run is to pick each letter, on the run's own prompts.

    .venv/bin/python tests/bench/choices.py LAKE [--versions 0,1,2,3,4] [--prompts 40]

For each env checkpoint, the mean over the run's simulator prompts (d_env's `sim_prompt`, an even spread of about
`--prompts` of them) of the next-token distribution after "(" renormalised over the letters a-d: what the simulator
would choose at sampling temperature 1.0, and, in the same pass, at the run's 0.7 (each prompt's distribution to the
power 1/0.7, renormalised). Measured this way instead of counting a run's chosen letters, which a run draws only 20 of
an epoch, and before the grammar, which admits every letter. Version 0 is the base model (`--base-model`).

Prints JSON: {version: {"t1.0": [a, b, c, d], "t0.7": [...]}} plus the prompts used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.domains.toolcall import CHOICES, letter  # noqa: E402
from lake import Lake, read_pool  # noqa: E402
from trainers.checkpoints import load_checkpoint  # noqa: E402


def letter_probabilities(model, tokenizer, prompts: list[str]) -> torch.Tensor:
    """(prompts, CHOICES): each prompt's probability of each letter's token after "(", renormalised."""
    letter_ids = [tokenizer.encode(letter(i)[1:2], add_special_tokens=False)[0] for i in range(CHOICES)]
    rows = []
    for prompt in prompts:
        encoded = tokenizer(prompt + "(", return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            logits = model(**encoded).logits[0, -1].float()
        p = torch.softmax(logits, -1)[letter_ids]
        rows.append(p / p.sum())
    return torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake")
    parser.add_argument("--versions", default="1,2,3,4")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--base-model", default="smollm2-135m")
    args = parser.parse_args()
    lake = Lake(args.lake, create=False)
    prompts = read_pool(lake, "d_env").sort("task_id")["sim_prompt"].to_list()
    prompts = prompts[:: max(1, len(prompts) // args.prompts)]
    result = {"prompts": len(prompts)}
    for version in (int(v) for v in args.versions.split(",")):
        loaded = load_checkpoint(lake, "env", version, base_model=args.base_model)
        p = letter_probabilities(loaded.model.eval(), loaded.tokenizer, prompts)
        sharpened = p ** (1 / 0.7)
        sharpened = sharpened / sharpened.sum(-1, keepdim=True)
        means = {"t1.0": p.mean(0), "t0.7": sharpened.mean(0)}
        result[version] = {name: [round(x, 3) for x in mean.tolist()] for name, mean in means.items()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
