"""Copy detection: detection rates against noise, false positives over seeds, copiers' rewards per policy.

Synthetic rounds: a shared signal plus private noise, each client with its own signal weight drawn from
U(0.2, 0.95) (so honest pairs range from weakly to strongly correlated), 20,000 coordinates. A copier
resubmits one client's update plus Gaussian noise of 1%, 5%, 20% of its std; a colluding pair submits one
shared random update (each with its own 5% noise).

Tiny federation, through the real pipeline (``kfca_llm.fl.rounds.run_federation`` on
``recipes/tiny.toml`` with recipe overrides): fixed attackers (``kfca.attackers``) that copy an honest client (``copy:0``,
``copy:0.01``, ``copy:0.05``, ``copy:0.2``) or collude (``collude:a`` twice), each run under every
``kfca.duplicates`` policy; honest-only federations over several seeds count false positives.

    python benchmarks/bench_robustness.py                  # the figures in benchmarks/ROBUSTNESS.md
    python benchmarks/bench_robustness.py --seeds 5 --rounds 1 --steps 1 --federation-seeds 1   # quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kfca_llm.engine import DuplicateRule, find_duplicates

COORDS = 20_000
NOISES = (0.01, 0.05, 0.1, 0.2)


def honest_round(n: int, rng: np.random.Generator) -> np.ndarray:
    signal = rng.standard_normal(COORDS)
    weight = rng.uniform(0.2, 0.95, size=(n, 1))
    return weight * signal + np.sqrt(1 - weight ** 2) * rng.standard_normal((n, COORDS))


def groups(updates: np.ndarray) -> list[tuple[int, ...]]:
    negative = updates < 0
    disagreements = (negative[:, None, :] != negative[None, :, :]).sum(axis=2)
    found = find_duplicates([f"{i:03d}" for i in range(len(updates))], disagreements, COORDS, DuplicateRule())
    return [tuple(int(c) for c in g.clients) for g in found]


def synthetic(seeds: int) -> None:
    print(f"## Synthetic rounds ({COORDS:,} coordinates, {seeds} seeds per cell)\n")
    print("| honest clients | false positives (rounds) | copy 1% | copy 5% | copy 10% | copy 20% | copy of the strongest, 10% "
          "| colluding pair |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (2, 3, 4, 6, 10, 20):
        fp, caught, strongest, pair = 0, dict.fromkeys(NOISES, 0), 0, 0
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            honest = honest_round(n, rng)
            fp += bool(groups(honest))
            victim = int(rng.integers(n))
            for noise in NOISES:
                copy = honest[victim] + noise * honest[victim].std() * rng.standard_normal(COORDS)
                caught[noise] += groups(np.vstack([honest, copy])) == [(victim, n)]
            top = int(np.argmax(np.abs(honest @ honest.sum(axis=0))))
            copy = honest[top] + 0.1 * rng.standard_normal(COORDS)
            strongest += groups(np.vstack([honest, copy])) == [(top, n)]
            shared = rng.standard_normal(COORDS)
            colluders = shared + 0.05 * rng.standard_normal((2, COORDS))
            pair += groups(np.vstack([honest, colluders])) == [(n, n + 1)]
        cells = [f"{fp}/{seeds}"] + [f"{caught[x]}/{seeds}" for x in NOISES] + [f"{strongest}/{seeds}", f"{pair}/{seeds}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()


POLICIES = ("flag", "split", "zero")
# Every client trains every round (the tiny recipe samples 3 of 6); no side-by-side attack analysis.
TINY_BASE = ["strategy.fraction-train=1.0", 'kfca.attacks=["honest"]']
ATTACKED = {
    "copy of an honest client, exact (copy:0)": ["5=copy:0"],
    "copy, 1% noise (copy:0.01)": ["5=copy:0.01"],
    "copy, 5% noise (copy:0.05)": ["5=copy:0.05"],
    "copy, 20% noise (copy:0.2)": ["5=copy:0.2"],
    "colluding pair (collude:a twice)": ["4=collude:a", "5=collude:a"],
}


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


def tiny_federation(rounds: int, steps: int, seeds: int) -> None:
    shape = [f"num-server-rounds={rounds}", f"train.training-arguments.max-steps={steps}", *TINY_BASE]
    start = time.perf_counter()
    print(f"## Tiny federation ({rounds} rounds, {steps} local steps, all 6 clients every round, seed 0)\n")
    print("| setting | copier flagged (rounds) | group | copiers' reward flag / split / zero "
          "| victim's reward flag / split / zero | other honest clients (zero) |")
    print("|---|---|---|---|---|---|")
    for name, entries in ATTACKED.items():
        runs = {p: federation([*shape, _attackers_setting(entries), f"kfca.duplicates={p}"]) for p in POLICIES}
        zero = runs["zero"]
        copiers = [f"client-{int(e.split('=')[0]):03d}" for e in entries]
        flagged = zero.flagged_clients()
        groups = sorted({tuple(g["clients"]) for r in zero.rounds for g in r.duplicates})
        victims = sorted({c for g in groups for c in g} - set(copiers))
        copier_pay = " / ".join(_mean(v for r in runs[p].rounds for c in copiers for v in [r.fixed_attacker_rewards[c]])
                                for p in POLICIES)
        victim_pay = " / ".join(_mean(r.honest_rewards[c] for r in runs[p].rounds for c in victims) for p in POLICIES)
        others = _mean(v for r in zero.rounds for c, v in r.honest_rewards.items() if c not in victims)
        caught = min(len(flagged.get(c, [])) for c in copiers)
        print(f"| {name} | {caught}/{rounds} | {'; '.join(','.join(g) for g in groups) or '-'} | {copier_pay} "
              f"| {victim_pay if victims else '-'} | {others} |")
    print(f"\n(trained in {time.perf_counter() - start:.0f} s: {3 * len(ATTACKED)} federations)\n")

    start = time.perf_counter()
    print(f"## Honest-only tiny federations: false positives over {seeds} seeds\n")
    print("| sampling | local steps | seed | rounds | honest clients ever flagged | groups found |")
    print("|---|---|---|---|---|---|")
    # One local step is the stress case: LoRA's A factors do not move in the first step (B starts at 0)
    # and AdamW's first step is the sign of the gradient, so honest updates are far more alike.
    for fraction, local_steps in (("1.0", steps), ("0.5", steps), ("1.0", 1)):
        for seed in range(seeds):
            result = federation([f"num-server-rounds={rounds}", f"train.training-arguments.max-steps={local_steps}",
                                 f"strategy.fraction-train={fraction}", 'kfca.attacks=["honest"]', f"kfca.seed={seed}"])
            flagged = result.flagged_clients()
            groups = sum(len(r.duplicates) for r in result.rounds)
            every = "all 6 clients" if fraction == "1.0" else "3 of 6 (the recipe's)"
            print(f"| {every} | {local_steps} | {seed} | {rounds} | {len(flagged)}: {', '.join(flagged) or '-'} "
                  f"| {groups} |")
    print(f"\n(trained in {time.perf_counter() - start:.0f} s)\n")

    # The recipe's own sampling: the copier is paid (and checked) only in rounds it is sampled; copy:NOISE
    # copies a client sampled in the same round, so its victim is always there to be compared with.
    result = federation([f"num-server-rounds={2 * rounds}", f"train.training-arguments.max-steps={steps}",
                         'kfca.attacks=["honest"]', _attackers_setting(["5=copy:0.05"])])
    sampled = [r.round for r in result.rounds if "client-005" in r.clients]
    flagged = result.flagged_clients().get("client-005", [])
    paid = [r.fixed_attacker_rewards["client-005"] for r in result.rounds if "client-005" in r.clients]
    print(f"- Recipe sampling (3 of 6 per round, {2 * rounds} rounds, `5=copy:0.05`, policy zero): the copier was "
          f"sampled in rounds {sampled or '-'}, flagged in rounds {flagged or '-'}, paid {_mean(paid)} on average "
          f"when sampled.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50, help="seeds per synthetic cell")
    parser.add_argument("--rounds", type=int, default=3, help="tiny-federation rounds (0: skip the federations)")
    parser.add_argument("--steps", type=int, default=4, help="local steps per round in the tiny federations")
    parser.add_argument("--federation-seeds", type=int, default=3, help="seeds of the honest-only federations")
    args = parser.parse_args()
    synthetic(args.seeds)
    if args.rounds:
        tiny_federation(args.rounds, args.steps, args.federation_seeds)


if __name__ == "__main__":
    main()
