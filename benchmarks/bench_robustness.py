"""Copy detection: copies with flipped signs caught, false positives over seeds, copiers' rewards per policy.

Synthetic rounds: a shared signal plus private noise, each client with its own signal weight drawn from
U(0.2, 0.95) (so honest pairs range from weakly to strongly correlated), 20,000 coordinates. A copier
resubmits one client's update with the signs of 1%, 5%, 10%, 20% of its coordinates flipped, or with
Gaussian noise of 20% of its std; the strongest client is copied with 10% noise; a colluding pair submits
one shared random update (each with its own 5% noise).

Tiny federations, through the real pipeline (``kfca_llm.fl.rounds.run_federation`` on ``recipes/tiny.toml``
with recipe overrides, every client training every round): fixed attackers (``kfca.attackers``) that copy
an honest client exactly (``copy:0``), with flipped signs (``copy-flip:F``, registered here) or Gaussian
noise (``copy:0.2``), or collude (``collude:a`` twice); each run once under ``flag`` (the rewards under
``split`` and ``zero`` follow from the groups by ``apply_duplicate_policy``, the model does not depend on
the policy). Honest-only federations with 4 to 20 clients over several seeds count false positives.

    python benchmarks/bench_robustness.py                  # the figures in benchmarks/ROBUSTNESS.md
    python benchmarks/bench_robustness.py --seeds 5 --rounds 1 --steps 1 --federation-seeds 1 --sizes 4   # quick
    python benchmarks/bench_robustness.py --seeds 1 --federation-seeds 5 --sizes 4 6 10 --one-step-sizes 4 6 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kfca_llm.engine import DuplicateRule, find_duplicates
from kfca_llm.engine.duplicates import apply_duplicate_policy

COORDS = 20_000
FLIPS = (0.01, 0.05, 0.1, 0.2)


def honest_round(n: int, rng: np.random.Generator) -> np.ndarray:
    signal = rng.standard_normal(COORDS)
    weight = rng.uniform(0.2, 0.95, size=(n, 1))
    return weight * signal + np.sqrt(1 - weight ** 2) * rng.standard_normal((n, COORDS))


def flipped(update: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(update.shape) < fraction, -update, update)


def groups(updates: np.ndarray) -> list[tuple[int, ...]]:
    negative = updates < 0
    disagreements = (negative[:, None, :] != negative[None, :, :]).sum(axis=2)
    found = find_duplicates([f"{i:03d}" for i in range(len(updates))], disagreements, COORDS, DuplicateRule())
    return [tuple(int(c) for c in g.clients) for g in found]


def synthetic(seeds: int) -> None:
    print(f"## Synthetic rounds ({COORDS:,} coordinates, {seeds} seeds per cell)\n")
    print("| honest clients | false positives (rounds) | " + " | ".join(f"copy, {x:.0%} flipped" for x in FLIPS)
          + " | copy, noise 20% of std | copy of the strongest, noise 10% | colluding pair |")
    print("|---|---|" + "---|" * (len(FLIPS) + 3))
    fp_total = 0
    for n in (2, 3, 4, 6, 10, 20):
        fp, caught, noisy, strongest, pair = 0, dict.fromkeys(FLIPS, 0), 0, 0, 0
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            honest = honest_round(n, rng)
            fp += bool(groups(honest))
            victim = int(rng.integers(n))
            for fraction in FLIPS:
                caught[fraction] += groups(np.vstack([honest, flipped(honest[victim], fraction, rng)])) == [(victim, n)]
            copy = honest[victim] + 0.2 * honest[victim].std() * rng.standard_normal(COORDS)
            noisy += groups(np.vstack([honest, copy])) == [(victim, n)]
            top = int(np.argmax(np.abs(honest @ honest.sum(axis=0))))
            copy = honest[top] + 0.1 * rng.standard_normal(COORDS)
            strongest += groups(np.vstack([honest, copy])) == [(top, n)]
            shared = rng.standard_normal(COORDS)
            colluders = shared + 0.05 * rng.standard_normal((2, COORDS))
            pair += groups(np.vstack([honest, colluders])) == [(n, n + 1)]
        fp_total += fp
        cells = [f"{fp}/{seeds}"] + [f"{caught[x]}/{seeds}" for x in FLIPS] + [
            f"{noisy}/{seeds}", f"{strongest}/{seeds}", f"{pair}/{seeds}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print(f"\nHonest rounds with any pair flagged: {fp_total} of {6 * seeds}.\n")


POLICIES = ("flag", "split", "zero")
# Every client trains every round (the tiny recipe samples 3 of 6); no side-by-side attack analysis.
TINY_BASE = ["strategy.fraction-train=1.0", 'kfca.attacks=["honest"]', "kfca.duplicates=flag"]
ATTACKED = {
    "copy of an honest client, exact (copy:0)": ["5=copy:0"],
    **{f"copy, {f:.0%} of signs flipped (copy-flip:{f})": [f"5=copy-flip:{f}"] for f in FLIPS},
    "copy, Gaussian noise 20% of std (copy:0.2)": ["5=copy:0.2"],
    "colluding pair (collude:a twice)": ["4=collude:a", "5=collude:a"],
}


def register_copy_flip() -> None:
    """``copy-flip:F``: another honest client's update of the round with the signs of a fraction F flipped."""
    import torch

    from kfca_llm.attacks import register_attack

    def fraction(text: str) -> float:
        value = float(text)
        if not 0.0 <= value < 0.5:
            raise ValueError(f"fraction must be in [0, 0.5), got {value}")
        return value

    @register_attack("copy-flip", parse=fraction, usage="copy-flip:F (0 <= F < 0.5)", context=True)
    def copy_flip(context, fraction):
        ids = sorted(context.others)
        source = context.others[ids[int(torch.randint(len(ids), (1,), generator=context.generator))]]
        out = {}
        for name in sorted(context.honest):  # name order: the same flips whatever the dict's order
            t = source[name]
            flips = torch.rand(t.shape, generator=context.generator) < fraction
            out[name] = torch.where(flips.to(t.device), -t, t)
        return {name: out[name] for name in context.honest}


def federation(overrides: list[str]):
    """One tiny federation through the real pipeline (``kfca_llm.fl.rounds.run_federation``)."""
    from kfca_llm.fl.rounds import FederationOptions, run_federation
    from kfca_llm.recipe import load_recipe

    return run_federation(load_recipe("tiny", overrides), FederationOptions(progress=False))


def _attackers_setting(entries: list[str]) -> str:
    return "kfca.attackers=[" + ", ".join(f'"{e}"' for e in entries) + "]"


def _mean(values) -> str:
    values = list(values)
    return f"{np.mean(values):+.3f}" if values else "-"


def _paid(record, policy: str) -> dict[str, float]:
    """A round's rewards of the real submissions (honest and fixed attackers) under ``policy``."""
    from kfca_llm.engine.duplicates import DuplicateGroup

    rewards = {**record.honest_rewards, **record.fixed_attacker_rewards}
    found = [DuplicateGroup(tuple(g["clients"]), ()) for g in record.duplicates]
    return apply_duplicate_policy(rewards, found, policy)


def tiny_federation(rounds: int, steps: int, seeds: int, sizes: list[int], one_step_sizes: list[int]) -> None:
    register_copy_flip()
    shape = [f"num-server-rounds={rounds}", f"train.training-arguments.max-steps={steps}", *TINY_BASE]
    start = time.perf_counter()
    print(f"## Tiny federation ({rounds} rounds, {steps} local steps, all 6 clients every round, seed 0)\n")
    print("| setting | copier flagged (rounds) | group | copiers' reward flag / split / zero "
          "| victim's reward flag / split / zero | other honest clients (zero) |")
    print("|---|---|---|---|---|---|")
    for name, entries in ATTACKED.items():
        run = federation([*shape, _attackers_setting(entries)])
        copiers = [f"client-{int(e.split('=')[0]):03d}" for e in entries]
        flagged = run.flagged_clients()
        found = sorted({tuple(g["clients"]) for r in run.rounds for g in r.duplicates})
        victims = sorted({c for g in found for c in g} - set(copiers))
        paid = {p: [_paid(r, p) for r in run.rounds] for p in POLICIES}
        copier_pay = " / ".join(_mean(rw[c] for rw in paid[p] for c in copiers) for p in POLICIES)
        victim_pay = " / ".join(_mean(rw[c] for rw in paid[p] for c in victims) for p in POLICIES)
        others = _mean(v for rw in paid["zero"] for c, v in rw.items() if c not in victims and c not in copiers)
        caught = min(len(flagged.get(c, [])) for c in copiers)
        print(f"| {name} | {caught}/{rounds} | {'; '.join(','.join(g) for g in found) or '-'} | {copier_pay} "
              f"| {victim_pay if victims else '-'} | {others} |")
    print(f"\n(trained in {time.perf_counter() - start:.0f} s: {len(ATTACKED)} federations)\n")

    start = time.perf_counter()
    print(f"## Honest-only tiny federations: false positives, {seeds} seeds per size\n")
    print("| clients | local steps | seed | rounds | honest clients ever flagged | groups found |")
    print("|---|---|---|---|---|---|")
    # One local step is the stress case: LoRA's A factors do not move in the first step (B starts at 0)
    # and AdamW's first step is the sign of the gradient, so honest updates are far more alike.
    cases = [(n, steps) for n in sizes] + [(n, 1) for n in one_step_sizes]
    total = 0
    for n, local_steps in cases:
        for seed in range(seeds):
            result = federation([f"num-clients={n}", f"num-server-rounds={rounds}",
                                 f"train.training-arguments.max-steps={local_steps}", "strategy.fraction-train=1.0",
                                 'kfca.attacks=["honest"]', f"kfca.seed={seed}"])
            flagged = result.flagged_clients()
            found = sum(len(r.duplicates) for r in result.rounds)
            total += len(flagged)
            print(f"| {n} | {local_steps} | {seed} | {rounds} | {len(flagged)}: {', '.join(flagged) or '-'} | {found} |")
    print(f"\nHonest clients ever flagged: {total} (trained in {time.perf_counter() - start:.0f} s)\n")

    # The recipe's own sampling: the copier is paid (and checked) only in rounds it is sampled; copy-flip
    # copies a client sampled in the same round, so its victim is always there to be compared with.
    result = federation([f"num-server-rounds={2 * rounds}", f"train.training-arguments.max-steps={steps}",
                         'kfca.attacks=["honest"]', _attackers_setting(["5=copy-flip:0.1"])])
    sampled = [r.round for r in result.rounds if "client-005" in r.clients]
    flagged = result.flagged_clients().get("client-005", [])
    paid = [r.fixed_attacker_rewards["client-005"] for r in result.rounds if "client-005" in r.clients]
    print(f"- Recipe sampling (3 of 6 per round, {2 * rounds} rounds, `5=copy-flip:0.1`, policy zero): the copier "
          f"was sampled in rounds {sampled or '-'}, flagged in rounds {flagged or '-'}, paid {_mean(paid)} on "
          f"average when sampled.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50, help="seeds per synthetic cell")
    parser.add_argument("--rounds", type=int, default=3, help="tiny-federation rounds (0: skip the federations)")
    parser.add_argument("--steps", type=int, default=4, help="local steps per round in the tiny federations")
    parser.add_argument("--federation-seeds", type=int, default=3, help="seeds of the honest-only federations")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 6, 10, 20],
                        help="clients in the honest-only federations")
    parser.add_argument("--one-step-sizes", type=int, nargs="*", default=[6],
                        help="clients in the honest-only federations of one local step (the stress case)")
    args = parser.parse_args()
    synthetic(args.seeds)
    if args.rounds:
        tiny_federation(args.rounds, args.steps, args.federation_seeds, args.sizes, args.one_step_sizes)


if __name__ == "__main__":
    main()
