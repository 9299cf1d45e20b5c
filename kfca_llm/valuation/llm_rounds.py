"""``kfca-llm simulate --valuation``: every ``adapters.ROUND_METHODS`` entry on each round of the LLM federation.

A round observer (``FederationOptions.on_round``): after each round is scored it values the clients'
submissions (fixed attackers' attacks included, the attack-analysis side submissions excluded) by
``adapters.value_round``, with v(S) = minus the held-out loss of the global adapter plus S's
reconstructed update. The held-out rows are synthetic rows from a seed no client trains on. KFCA-QP conditions on
the globals the observer has seen (the recipe's ``kfca.public-steps``), as the federation's scoring does; after a
``--resume`` it knows only the globals from the resumed round on.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InputError
from ..recipe import Recipe
from ..report import text_table
from .adapters import REFERENCE, ROUND_METHODS, RoundValuation, mean_values, value_round

HELD_OUT_ROWS = 32
HELD_OUT_SEED_OFFSET = 1_000_003  # synthetic rows of seed + offset: never in any client's shard
LOSS_BATCH = 8


class RoundValuer:
    """Collects a ``RoundValuation`` per round; pass the instance as ``FederationOptions.on_round``."""

    def __init__(self, recipe: Recipe, data_dir=None, held_out_rows: int = HELD_OUT_ROWS):
        from ..data import SYNTHETIC_DATASET

        if data_dir is not None or recipe.dataset.name != SYNTHETIC_DATASET:
            raise InputError("--valuation needs held-out rows; it runs on the synthetic data set only (for now)")
        self.recipe = recipe
        self.held_out_rows = held_out_rows
        self.rounds: list[RoundValuation] = []
        self.fixed_attacks: dict[str, str] = {}
        self._held_out = None
        self._sent: list = []  # the globals of the rounds seen, oldest first (the newest the conditioning reads)

    def _examples(self, tokenizer) -> list:
        if self._held_out is None:
            from .. import synthetic
            from ..data import IGNORE_INDEX, encode_example, format_example

            r = self.recipe
            rows = synthetic.make_rows(r.domain, self.held_out_rows, r.kfca.seed + HELD_OUT_SEED_OFFSET)
            encoded = [encode_example(tokenizer, *format_example(row, r.domain, prompt_format=r.train.prompt_format,
                                                                  tokenizer=tokenizer), r.train.seq_length)
                       for row in rows]
            self._held_out = [e for e in encoded if any(label != IGNORE_INDEX for label in e["labels"])]
        return self._held_out

    def __call__(self, ctx) -> None:
        from ..fl.client import batch_loss, load_adapter_state
        from ..fl.rounds import public_steps

        examples = self._examples(ctx.tokenizer)
        model = ctx.model

        @torch.no_grad()
        def held_out_loss(state) -> float:
            load_adapter_state(model, state)
            was_training = model.training
            model.eval()
            losses = [float(batch_loss(model, examples[i:i + LOSS_BATCH], ctx.pad_token_id, ctx.device)) *
                      len(examples[i:i + LOSS_BATCH]) for i in range(0, len(examples), LOSS_BATCH)]
            model.train(was_training)
            return sum(losses) / len(examples)

        conditioning = self.recipe.kfca.conditioning
        self._sent = [*self._sent, ctx.global_state][-(conditioning.history + 1):]
        own = [s for s in ctx.submissions if not s.analysis]
        self.fixed_attacks.update({s.client: s.strategy for s in own if not s.honest})
        self.rounds.append(value_round(ctx.global_state, {s.client: s.update for s in own},
                                       {s.client: s.num_examples for s in own}, held_out_loss,
                                       round_index=ctx.round, seed=self.recipe.kfca.seed + ctx.round,
                                       public=public_steps(self._sent), conditioning=conditioning))

    def to_dict(self) -> dict:
        return {"v": "minus held-out loss of global + reconstructed coalition update",
                "held_out_rows": len(self._held_out or []), "fixed_attacks": self.fixed_attacks,
                "mean": mean_values(self.rounds), "rounds": [r.to_dict() for r in self.rounds]}

    def table(self) -> str:
        means = mean_values(self.rounds)
        clients = sorted(means[REFERENCE], key=lambda c: -means[REFERENCE][c])
        # a knowledge-free method's values are payments (4 digits); Shapley values are loss differences (5)
        digits = {k: 4 if m.knowledge_free else 5 for k, m in ROUND_METHODS.items()}
        second_digits = {k: 3 if m.knowledge_free else 2 for k, m in ROUND_METHODS.items()}  # KFCA takes ms
        rows = [[c, self.fixed_attacks.get(c, "honest"),
                 *[f"{means[k][c]:+.{digits[k]}f}" for k in ROUND_METHODS]] for c in clients]
        others = [k for k in ROUND_METHODS if k != REFERENCE]
        dist = {k: np.mean([r.distance_to_mr[k]["cosine"] for r in self.rounds]) for k in others}
        secs = {k: sum(r.seconds[k] for r in self.rounds) for k in ROUND_METHODS}
        name = {k: m.name for k, m in ROUND_METHODS.items()}
        notes = [f"mean 1 - cos to {name[REFERENCE]} per round: "
                 + ", ".join(f"{name[k]} {dist[k]:.4f}" for k in others),
                 "time over all rounds: "
                 + ", ".join(f"{name[k]} {secs[k]:.{second_digits[k]}f} s" for k in ROUND_METHODS)]
        return text_table("per-client mean value per round (v = -held-out loss)",
                          ["client", "submits", *name.values()], rows, notes)
