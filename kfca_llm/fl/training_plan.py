"""The recipe resolved once into what local training needs: a ``TrainingPlan``.

``fl.client`` trains from the plan alone: the optimizer, each round's learning rate (FlowerTune's cosine over the
rounds, constant inside a round), the schedule inside the round, the batch shape, how many optimizer steps a
client's data gives, clipping, and the seeds of the clients' and the server's reference training. The driver
(``fl.rounds``), the Flower app (``flower.task``) and whoever else trains build it once with
``TrainingPlan.of(recipe)``; nothing in training reaches back into the recipe.

(Not ``kfca_llm.plan``: that is the dry-run planner of a whole run.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..recipe import Recipe, lr_for_round
from .seeds import REFERENCE_TRAIN, derive_seed, train_seed


@dataclass(frozen=True)
class TrainingPlan:
    """What one client's local training in any round reads of the recipe (Hugging Face ``Trainer`` semantics)."""

    optim: str
    """``train.training-arguments.optim``: the optimizer (``fl.client.make_optimizer``)."""
    learning_rates: tuple[float, ...]
    """Round ``t``'s learning rate at index ``t - 1`` (``recipe.lr_for_round``): read with ``lr(t)``."""
    lr_scheduler_type: str
    """The schedule over the round's optimizer steps, from the round's learning rate."""
    warmup_steps: int
    """> 0 wins over ``warmup_ratio`` (``warmup(steps)``)."""
    warmup_ratio: float
    per_device_train_batch_size: int
    """Examples per micro-batch."""
    gradient_accumulation_steps: int
    """Micro-batches per optimizer step; each micro-batch loss is divided by it."""
    num_train_epochs: int
    max_steps: int
    """Optimizer steps per round when > 0 (it caps the epochs); else ``num_train_epochs`` over the client's data."""
    max_grad_norm: float
    """Gradient clipping norm; 0: off."""
    seed: int
    """``kfca.seed``: the run's seed, which the clients' and the reference's training seeds derive from."""
    dynamic_data_seed: bool
    """``train.dynamic-data-seed``: a client's data order (and dropout) seeded by the round as well."""

    @classmethod
    def of(cls, recipe: Recipe) -> TrainingPlan:
        ta = recipe.train.training_arguments
        return cls(optim=ta.optim,
                   learning_rates=tuple(lr_for_round(recipe, t) for t in range(1, recipe.num_server_rounds + 1)),
                   lr_scheduler_type=ta.lr_scheduler_type, warmup_steps=ta.warmup_steps, warmup_ratio=ta.warmup_ratio,
                   per_device_train_batch_size=ta.per_device_train_batch_size,
                   gradient_accumulation_steps=ta.gradient_accumulation_steps, num_train_epochs=ta.num_train_epochs,
                   max_steps=ta.max_steps, max_grad_norm=ta.max_grad_norm, seed=recipe.kfca.seed,
                   dynamic_data_seed=recipe.train.dynamic_data_seed)

    def lr(self, server_round: int) -> float:
        """The learning rate round ``server_round`` (1-based) starts from."""
        if not 1 <= server_round <= len(self.learning_rates):
            raise ValueError(f"round {server_round} is outside 1..{len(self.learning_rates)}")
        return self.learning_rates[server_round - 1]

    @property
    def examples_per_step(self) -> int:
        """Examples per optimizer step: the micro-batch times the gradient accumulation steps."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def local_steps(self, num_examples: int) -> int:
        """Optimizer steps per round: ``max-steps`` when positive (it caps the epochs, as in Hugging Face)."""
        if self.max_steps > 0:
            return self.max_steps
        return max(1, math.ceil(num_examples / self.examples_per_step)) * self.num_train_epochs

    def warmup(self, steps: int) -> int:
        """Hugging Face's rule: ``warmup-steps`` when positive, else ``ceil(warmup-ratio * steps)``."""
        return self.warmup_steps if self.warmup_steps > 0 else math.ceil(self.warmup_ratio * steps)

    def client_seed(self, server_round: int, partition: int) -> int:
        """Client ``partition``'s training seed in ``server_round`` (``fl.seeds.train_seed``)."""
        return train_seed(self.seed, server_round, partition, self.dynamic_data_seed)

    def reference_seed(self, server_round: int) -> int:
        """The seed of the server's reference training in ``server_round``: the run's seed and the round alone."""
        return derive_seed(self.seed, REFERENCE_TRAIN, server_round)
