"""A label-skewable classification task for the tiny LLM (the paper's AG News row, built in the package).

Rows are short synthetic news lines whose words come mostly from one of five topics; the answer is the
topic's name. Each name starts with its own byte, so the tiny byte-level model's prediction is the
label whose first byte gets the highest logit after the prompt. ``llm_task`` runs FedAvg of LoRA
adapters (``fl.client.train_client``, the tiny recipe) on any partition of the rows, for the non-IID
sweep of ``noniid``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import InputError

TOPICS = {
    "world": ("summit", "minister", "border", "treaty", "embassy", "election", "refugees", "parliament"),
    "sport": ("match", "goal", "coach", "league", "striker", "tennis", "season", "stadium"),
    "money": ("shares", "profit", "bank", "market", "investors", "dividend", "merger", "earnings"),
    "tech": ("software", "chip", "startup", "robot", "laptop", "browser", "satellite", "algorithm"),
    "health": ("doctors", "vaccine", "hospital", "virus", "patients", "diet", "surgery", "clinic"),
}
LABELS = tuple(TOPICS)
INSTRUCTION = "Topic?"
WORDS_PER_ROW = 5
TOPIC_WORD_SHARE = 0.8  # each word comes from the row's topic with this probability, else from another topic
DOMAIN = "finance"  # the schema whose instruction is "instruction input" (FlowerTune's rule)
HELD_OUT_SEED_OFFSET = 7919  # test rows come from a seed no client's rows use
HELD_OUT_ROWS = 100
ROWS_PER_CLIENT = 60
# local steps per round: the tiny model (random frozen base, LoRA only) needs ~300 steps of the
# recipe's learning rate to learn the topics (measured: 84% held-out accuracy after 300 centralised steps)
LOCAL_STEPS = 30


def make_topic_rows(n_rows: int, seed: int) -> tuple[list[dict[str, str]], np.ndarray]:
    """``n_rows`` rows (instruction, input, output) and their int labels, balanced over the topics."""
    rng = np.random.default_rng(seed)
    labels = np.resize(np.arange(len(LABELS)), n_rows)
    rng.shuffle(labels)
    rows = []
    for label in labels:
        words = []
        for _ in range(WORDS_PER_ROW):
            topic = label if rng.random() < TOPIC_WORD_SHARE else rng.choice(
                [k for k in range(len(LABELS)) if k != label])
            words.append(str(rng.choice(TOPICS[LABELS[topic]])))
        rows.append({"instruction": INSTRUCTION, "input": " ".join(words) + ".", "output": LABELS[label]})
    return rows, labels.astype(np.int64)


def encode_rows(rows: Sequence[dict], tokenizer, recipe) -> list[dict]:
    from ..data import encode_example, format_example

    return [encode_example(tokenizer, *format_example(row, DOMAIN, prompt_format=recipe.train.prompt_format,
                                                      tokenizer=tokenizer), recipe.train.seq_length) for row in rows]


def label_token_ids(tokenizer, recipe) -> list[int]:
    """The first response token of each label (distinct by construction)."""
    ids = []
    for label in LABELS:
        encoded = encode_rows([{"instruction": INSTRUCTION, "input": "x.", "output": label}], tokenizer, recipe)[0]
        first = next(k for k, v in enumerate(encoded["labels"]) if v != -100)
        ids.append(encoded["input_ids"][first])
    if len(set(ids)) != len(ids):
        raise InputError(f"the labels' first tokens collide: {ids}")
    return ids


@torch.no_grad()
def predict(model, examples: Sequence[dict], label_ids: list[int], pad_token_id: int, batch: int = 16) -> np.ndarray:
    """int (m,) predicted labels: argmax over the labels' first tokens at the first response position."""
    from ..data import collate

    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(examples), batch):
        chunk = examples[start:start + batch]
        tensors = collate(chunk, pad_token_id)
        logits = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"]).logits
        first = [next(k for k, v in enumerate(e["labels"]) if v != -100) for e in chunk]
        rows = logits[torch.arange(len(chunk)), torch.tensor(first) - 1][:, label_ids]
        out.append(rows.argmax(-1).numpy())
    model.train(was_training)
    return np.concatenate(out)


def llm_task(cfg, rows_per_client: int = ROWS_PER_CLIENT, local_steps: int = LOCAL_STEPS):
    """The sweep's federation on the tiny LLM: the tiny recipe's model, LoRA and local training."""
    from ..fl.client import adapter_state, load_adapter_state, train_client
    from ..fl.seeds import derive_seed
    from ..fl.training_plan import TrainingPlan
    from ..modeling import load_model_and_tokenizer
    from ..recipe import load_recipe
    from .noniid import FederationRun, RoundSignals, SweepTask, class_counts

    recipe = load_recipe("tiny", [f"kfca.seed={cfg.seed}", f"train.training-arguments.max-steps={local_steps}"])
    if cfg.rounds > recipe.num_server_rounds:  # the learning-rate schedule spans the recipe's rounds
        recipe = load_recipe("tiny", [f"kfca.seed={cfg.seed}", f"train.training-arguments.max-steps={local_steps}",
                                      f"num-server-rounds={cfg.rounds}"])
    plan = TrainingPlan.of(recipe)
    model, tokenizer = load_model_and_tokenizer(recipe)
    pad = tokenizer.pad_token_id
    rows, labels = make_topic_rows(rows_per_client * cfg.clients, cfg.seed)
    examples = encode_rows(rows, tokenizer, recipe)
    test_rows, test_labels = make_topic_rows(HELD_OUT_ROWS, cfg.seed + HELD_OUT_SEED_OFFSET)
    test = encode_rows(test_rows, tokenizer, recipe)
    label_ids = label_token_ids(tokenizer, recipe)
    initial = adapter_state(model)
    names = sorted(initial)

    def flat(state) -> torch.Tensor:
        return torch.cat([state[k].flatten() for k in names])

    history = cfg.conditioning.history

    def run(parts: list[np.ndarray]) -> FederationRun:
        global_state = {k: v.clone() for k, v in initial.items()}
        sizes = np.array([p.size for p in parts], dtype=np.float64)
        rounds, sent = [], []  # sent: the flat globals of the rounds so far, oldest first
        for t in range(cfg.rounds):
            sent = [*sent, flat(global_state)][-(history + 1):]
            updates, predicted = [], []
            for c, part in enumerate(parts):
                update = train_client(model, global_state, [examples[i] for i in part], plan, server_round=t + 1,
                                      seed=derive_seed(cfg.seed, t, c), device=torch.device("cpu"),
                                      pad_token_id=pad).update
                load_adapter_state(model, {k: global_state[k] + update[k] for k in names})
                predicted.append(predict(model, test, label_ids, pad))
                updates.append(update)
            rounds.append(RoundSignals(torch.stack([flat(u) for u in updates]), np.stack(predicted),
                                       [new - old for old, new in zip(sent, sent[1:])]))
            weights = sizes / sizes.sum()
            global_state = {k: global_state[k] + sum(float(w) * u[k] for w, u in zip(weights, updates))
                            for k in names}
        load_adapter_state(model, global_state)
        accuracy = float(np.mean(predict(model, test, label_ids, pad) == test_labels))
        return FederationRun(rounds, accuracy, class_counts(labels, parts, len(LABELS)), len(LABELS),
                             {"parameters": int(flat(initial).numel())})

    return SweepTask(f"tiny LLM ({recipe.model.name}, LoRA r={recipe.model.lora.peft_lora_r}) on {len(LABELS)} "
                     f"synthetic news topics", labels, run)
