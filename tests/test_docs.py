"""The pages hold together: every relative link of README.md and docs/*.md reaches an existing file (and heading)."""

from __future__ import annotations

import re

import pytest
from doc_pages import ROOT, page, page_names

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose_keeping_code(text: str) -> str:
    """The text without fenced blocks (whose ``#`` lines are comments, not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The text without fenced blocks and inline code, where brackets are code, not links."""
    return re.sub(r"`[^`\n]*`", "", prose_keeping_code(text))


def anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a markdown page: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading numbered -1, -2, ..."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", prose_keeping_code(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        repeats[slug] = repeats.get(slug, -1) + 1
        found.add(f"{slug}-{repeats[slug]}" if repeats[slug] else slug)
    return found


def relative_links(name: str) -> list[str]:
    return [t for t in LINK.findall(prose(page(name))) if not re.match(r"[a-z]+:", t)]


def test_anchors_follow_githubs_rule():
    text = "# The mechanism, exactly\n## Reward fidelity (`kfca-llm fidelity`)\n## Audit\n## Audit\n"
    assert anchors(text) == {"the-mechanism-exactly", "reward-fidelity-kfca-llm-fidelity", "audit", "audit-1"}


def test_the_front_page_links_every_docs_page():
    linked = {str((ROOT / t.split("#")[0]).resolve().relative_to(ROOT)) for t in relative_links("README.md")}
    assert set(page_names()[1:]) <= linked


@pytest.mark.parametrize("name", page_names())
def test_every_relative_link_reaches_a_file_and_its_heading(name):
    for target in relative_links(name):
        path, _, anchor = target.partition("#")
        file = (ROOT / name).parent / path if path else ROOT / name
        assert file.exists(), f"{name}: {target} points at a missing file"
        if anchor:
            assert file.suffix == ".md" and anchor in anchors(file.read_text()), f"{name}: no heading #{anchor}"


def test_the_recipe_table_is_what_the_recipe_files_hold():
    from doc_pages import markdown_table
    from helpers import RECIPES

    from kfca_llm.recipe import clients_per_round, load_recipe

    def lr(value: float) -> str:
        return f"{value:.0e}".replace("e-0", "e-")

    def targets(names: tuple[str, ...]) -> str:
        return "all 7" if len(names) == 7 else ", ".join(n.removesuffix("_proj") for n in names)

    rows = markdown_table(page("docs/recipes.md"), "| recipe | base model |")
    assert [r[0] for r in rows] == ["general-nlp", "finance", "medical", "code"]
    for row in rows:
        rec = load_recipe(RECIPES / f"{row[0]}.toml")
        lora, ta = rec.model.lora, rec.train.training_arguments
        assert row == [rec.name, rec.model.name, "LoRA + DoRA" if lora.peft_use_dora else "LoRA",
                       f"{lora.peft_lora_r} / {lora.peft_lora_alpha}", targets(lora.target_modules),
                       f"{ta.per_device_train_batch_size} x {ta.gradient_accumulation_steps}",
                       f"{lr(rec.train.learning_rate_max)} / {lr(rec.train.learning_rate_min)}",
                       f"{rec.num_clients} ({clients_per_round(rec)})"]


def test_the_shapley_example_prints_what_its_comment_says(capsys):
    from doc_pages import one_block

    block = one_block("docs/evidence.md", "python", "shapley_exact(v, 3)")
    exec(compile(block, "docs/evidence.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    commented = re.search(r"print\(shapley_exact\(v, 3\)\.round\(4\)\)\s+# (\[[^\]]+\])", block)[1]
    assert printed[0] == commented


def test_every_path_of_the_layout_exists():
    """docs/engine.md's tree of the repository: each file and folder it names (by indentation) is there."""
    from doc_pages import fenced_blocks

    text = page("docs/engine.md")
    (tree,) = fenced_blocks(text[text.index("## Layout"):], "")[:1]
    stack, named = [], []
    for line in tree.splitlines():
        entry = re.match(r"^( *)(\S+)", line)
        if entry and entry[2].endswith((".py", "/")):  # other lines continue a description
            stack[len(entry[1]) // 2:] = [entry[2]]
            named.append("".join(stack))
    assert len(named) > 60 and "kfca_llm/engine/stats.py" in named and "kernels/sign_pack/" in named
    assert [p for p in named if not (ROOT / p).exists()] == []
