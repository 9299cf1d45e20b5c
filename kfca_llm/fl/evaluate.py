"""The global adapter's own quality: loss and exact-answer accuracy on held-out rows (``data.load_heldout_examples``).

Exact-answer accuracy is the share of rows whose every response token (end of sequence included) is the
model's most likely next token given the true prefix: exactly the rows greedy decoding answers word for
word, computed in one forward pass. Used by ``kfca-llm simulate`` (each round) and the Flower ClientApp's
evaluate round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..data import IGNORE_INDEX, collate
from .client import load_adapter_state

EVAL_BATCH = 16


def evaluate_adapter(model, examples: Sequence[Mapping[str, Any]], pad_token_id: int, device: torch.device
                     ) -> dict[str, float | int]:
    """``{"loss": mean response-token loss, "accuracy": exact-answer share, "rows": n}`` of the model as it is."""
    was_training = model.training
    model.eval()
    loss_sum, tokens, exact = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(examples), EVAL_BATCH):
            batch = {k: v.to(device) for k, v in collate(examples[start:start + EVAL_BATCH], pad_token_id).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            predicted, labels = logits[:, :-1], batch["labels"][:, 1:]  # position i predicts token i + 1
            scored = labels != IGNORE_INDEX
            # Flat [tokens, vocabulary]: CUDA's 2-d form (nll_loss2d) has no deterministic kernel (fl.client)
            loss_sum += float(torch.nn.functional.cross_entropy(predicted.reshape(-1, predicted.shape[-1]),
                                                                labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                                                reduction="sum"))
            tokens += int(scored.sum())
            exact += int(((predicted.argmax(-1) == labels) | ~scored).all(dim=1).sum())
    model.train(was_training)
    return {"loss": loss_sum / max(tokens, 1), "accuracy": exact / len(examples), "rows": len(examples)}


def evaluate_global(model, global_state: Mapping[str, torch.Tensor], examples: Sequence[Mapping[str, Any]],
                    pad_token_id: int, device: torch.device) -> dict[str, float | int]:
    """``evaluate_adapter`` with the global adapter loaded into ``model`` (its adapter is overwritten)."""
    load_adapter_state(model, global_state)
    return evaluate_adapter(model, examples, pad_token_id, device)
