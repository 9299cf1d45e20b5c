"""The four FlowerTune recipes hold the winner settings of the reference table."""

import pytest

from kfca_llm.recipe import clients_per_round, load_recipe

from helpers import RECIPES

ALL7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# domain: model, dora, r, alpha, targets, batch, accumulation, lr max, lr min, clients, fraction, data set, prompt
WINNERS = {
    "general-nlp": ("internlm/internlm3-8b-instruct", False, 16, 32, ("q_proj", "k_proj", "v_proj", "o_proj"),
                    1, 4, 5e-5, 1e-6, 20, 0.1, "flwrlabs/alpaca-gpt4", "alpaca"),
    "finance": ("Qwen/Qwen2.5-7B", False, 32, 64, ALL7, 16, 1, 5e-4, 5e-5, 20, 0.1,
                "flwrlabs/fingpt-sentiment-train", "chat-template"),
    "medical": ("HPAI-BSC/Llama3.1-Aloe-Beta-8B", False, 32, 128, ("q_proj", "v_proj"), 16, 2, 1e-4, 1e-5, 20, 0.1,
                "flwrlabs/medical-meadow-medical-flashcards", "alpaca"),
    "code": ("Qwen/Qwen3-8B", True, 8, 16, ALL7, 2, 4, 5e-5, 5e-6, 10, 0.2, "flwrlabs/code-alpaca-20k",
             "chat-template"),
}


@pytest.mark.parametrize("domain", list(WINNERS))
def test_recipe_file_holds_the_winner_settings(domain):
    model, dora, r, alpha, targets, batch, accum, lr_max, lr_min, clients, fraction, data, fmt = WINNERS[domain]
    rec = load_recipe(RECIPES / f"{domain}.toml")
    assert rec.name == domain and rec.domain == domain
    assert rec.model.name == model
    assert rec.model.quantization == 4 and rec.model.gradient_checkpointing is True
    assert rec.model.trust_remote_code is False
    lora = rec.model.lora
    assert (lora.peft_use_dora, lora.peft_lora_r, lora.peft_lora_alpha) == (dora, r, alpha)
    assert lora.target_modules == targets and lora.peft_lora_dropout == 0.075
    ta = rec.train.training_arguments
    assert (ta.per_device_train_batch_size, ta.gradient_accumulation_steps) == (batch, accum)
    assert (ta.num_train_epochs, ta.max_steps) == (3, 10)
    assert ta.optim == "paged_adamw_8bit"
    assert (rec.train.learning_rate_max, rec.train.learning_rate_min) == (lr_max, lr_min)
    assert rec.train.seq_length == 512 and rec.train.prompt_format == fmt
    assert (rec.num_clients, rec.strategy.fraction_train) == (clients, fraction)
    assert clients_per_round(rec) == 2
    assert rec.num_server_rounds == 10
    assert rec.dataset.name == data and rec.dataset.num_rows is None
    assert "honest" in rec.kfca.attacks and rec.kfca.penalty == "expected"


def test_every_recipe_file_parses():
    names = sorted(p.stem for p in RECIPES.glob("*.toml"))
    assert names == ["code", "finance", "general-nlp", "medical", "tiny"]
    for path in RECIPES.glob("*.toml"):
        assert load_recipe(path).name == path.stem


def test_recipe_comments_name_no_path_outside_the_repository():
    """A comment may point at a file of this repository or a public source, never at a path of the machine it
    was written on (an absolute or home path means nothing in a user's clone)."""
    import re

    outside = re.compile(r"(?:^|[\s(\"'`])(?:/|~/)[\w.-]+/")
    for path in sorted(RECIPES.rglob("*.toml")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            comment = line.partition("#")[2]
            assert not outside.search(comment), f"{path.name}:{number} names a path outside the repository: {line}"
