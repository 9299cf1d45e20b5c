"""Copy detection: detection rates against noise, false positives over seeds, copiers' rewards per policy.

Synthetic rounds: a shared signal plus private noise, each client with its own signal weight drawn from
U(0.2, 0.95) (so honest pairs range from weakly to strongly correlated), 20,000 coordinates. A copier
resubmits one client's update plus Gaussian noise of 1%, 5%, 20% of its std; a colluding pair submits one
shared random update (each with its own 5% noise). Tiny federation: honest round updates of all six
clients of ``recipes/tiny.toml`` (LoRA, 8 local steps from the round's global adapter, FedAvg between
rounds), with the same copiers added (noise relative to each tensor's std), scored by ``score_updates``.

    python benchmarks/bench_robustness.py                  # the figures in benchmarks/ROBUSTNESS.md
    python benchmarks/bench_robustness.py --seeds 5 --rounds 1   # quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import kfca_llm
from kfca_llm import SignPacker
from kfca_llm.engine import DuplicateRule, disagreement_counts, find_duplicates
from kfca_llm.engine.duplicates import _excess_correlation

COORDS = 20_000
NOISES = (0.01, 0.05, 0.2)


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
    print("| honest clients | false positives (rounds) | copy 1% | copy 5% | copy 20% | copy of the strongest, 20% "
          "| colluding pair |")
    print("|---|---|---|---|---|---|---|")
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
            copy = honest[top] + 0.2 * rng.standard_normal(COORDS)
            strongest += groups(np.vstack([honest, copy])) == [(top, n)]
            shared = rng.standard_normal(COORDS)
            colluders = shared + 0.05 * rng.standard_normal((2, COORDS))
            pair += groups(np.vstack([honest, colluders])) == [(n, n + 1)]
        cells = [f"{fp}/{seeds}"] + [f"{caught[x]}/{seeds}" for x in NOISES] + [f"{strongest}/{seeds}", f"{pair}/{seeds}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()


def tiny_federation_updates(rounds: int) -> list[dict[str, dict[str, torch.Tensor]]]:
    """Honest updates of every client of the tiny recipe, for ``rounds`` rounds of FedAvg over all of them."""
    from kfca_llm.data import load_client_datasets
    from kfca_llm.federated import adapter_state, client_id, derive_seed, fedavg, train_client
    from kfca_llm.modeling import load_model_and_tokenizer
    from kfca_llm.recipe import load_recipe, lr_for_round
    from kfca_llm.simulate import resolve_recipe_path

    recipe = load_recipe(resolve_recipe_path("tiny"))
    model, tokenizer = load_model_and_tokenizer(recipe, device="cpu")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    datasets = load_client_datasets(recipe, tokenizer)
    state = adapter_state(model)
    out = []
    for t in range(1, rounds + 1):
        local = {client_id(i): train_client(model, state, datasets[i], recipe, lr=lr_for_round(recipe, t),
                                            seed=derive_seed(recipe.kfca.seed, 1, t, i), device=torch.device("cpu"),
                                            pad_token_id=pad)
                 for i in range(recipe.num_clients)}
        out.append({c: r.update for c, r in local.items()})
        state = fedavg(state, [(c, r.update, r.num_examples) for c, r in local.items()])
    return out


def noisy(update: dict[str, torch.Tensor], noise: float, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {k: v + noise * v.float().std() * torch.randn(v.shape, generator=g) for k, v in update.items()}


def honest_spread(updates: dict[str, dict[str, torch.Tensor]]) -> str:
    """Agreement range and largest excess correlation among honest pairs (how far they are from the rules)."""
    first = next(iter(updates.values()))
    packer = SignPacker({k: tuple(v.shape) for k, v in first.items()}, list(updates))
    for client, update in updates.items():
        packer.add_many(client, update)
    counts = packer.backend.round_counts(packer.buffers, 0, 0.5)
    rate = disagreement_counts(counts) / counts.sizes.sum()
    excess, _ = _excess_correlation(rate, int(counts.sizes.sum()))
    upper = np.triu_indices(len(updates), 1)
    return (f"agreement {1 - rate[upper].max():.3f}..{1 - rate[upper].min():.3f}, "
            f"largest excess correlation {excess[upper].max():+.3f}")


def tiny_federation(rounds: int) -> None:
    start = time.perf_counter()
    all_rounds = tiny_federation_updates(rounds)
    print(f"## Tiny federation ({rounds} rounds x 6 honest clients, trained in {time.perf_counter() - start:.0f} s)\n")
    print("| round | setting | groups found | copiers' reward flag / split / zero | honest mean reward |")
    print("|---|---|---|---|---|")
    for t, honest in enumerate(all_rounds, start=1):
        g = torch.Generator().manual_seed(t)
        cases = {"honest only (6)": ({}, [])}
        for subset in (3, 4):
            cases[f"honest only ({subset} of 6)"] = ("subset", subset)
        for noise in (0.0,) + NOISES:
            cases[f"copy of client-001, noise {noise:.0%}"] = (
                {"copier": noisy(honest["client-001"], noise, g) if noise else honest["client-001"]}, ["copier"])
        shared = {k: torch.randn(v.shape, generator=g) * v.float().std() for k, v in honest["client-002"].items()}
        cases["colluding pair, one random update"] = ({"colluder-a": shared, "colluder-b": noisy(shared, 0.05, g)},
                                                      ["colluder-a", "colluder-b"])
        for name, (extra, copiers) in cases.items():
            if extra == "subset":
                clients = dict(list(honest.items())[:copiers])
                copiers = []
            else:
                clients = honest | extra
            reports = {p: kfca_llm.score_updates(clients, seed=t, duplicates=p) for p in ("flag", "split", "zero")}
            found = "; ".join(",".join(g.clients) for g in reports["flag"].duplicates) or "-"
            paid = " / ".join(f"{np.mean([reports[p].rewards[c] for c in copiers]):+.3f}" for p in reports) if copiers else "-"
            honest_mean = np.mean([reports["flag"].rewards[c] for c in honest if c in clients])
            print(f"| {t} | {name} | {found} | {paid} | {honest_mean:+.3f} |")
    print()
    for t, honest in enumerate(all_rounds, start=1):
        print(f"- round {t}, honest pairs: {honest_spread(honest)} (thresholds: agreement >= 0.98, excess >= 0.5)")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    synthetic(args.seeds)
    if args.rounds:
        tiny_federation(args.rounds)


if __name__ == "__main__":
    main()
