"""Synthetic rows in each FlowerTune domain's column schema (``instruction``, ``input``, ``output``).

Every output is a deterministic function of the columns the domain's formatting rule keeps, so a model
trained on these rows really lowers its loss (and honest clients drawn from the same distribution move
their adapters in correlated directions, which is what KFCA rewards):

- general NLP (instruction only): simple word transforms named in the instruction;
- finance (instruction + input): FinGPT-style sentiment question, the news sentence's verb decides the label;
- medical (input is the question): a fixed term -> definition table, MedAlpaca flashcard style;
- code (instruction + input): small arithmetic / Python templates.
"""

from __future__ import annotations

import random

from .recipe import DOMAINS

_WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket", "garden", "silver",
          "marble", "forest", "candle", "window", "planet", "bridge")

_FIN_INSTRUCTION = ("What is the sentiment of this news? Please choose an answer from "
                    "{negative/neutral/positive}.")
_FIN_COMPANIES = ("Acme Corp", "Globex", "Initech", "Umbrella", "Stark Ltd", "Wayne Group", "Hooli", "Vandelay")
_FIN_VERBS = {
    "positive": ("soared", "jumped", "beat forecasts", "raised its dividend", "rallied"),
    "negative": ("plunged", "missed forecasts", "cut its dividend", "slumped", "warned on profit"),
    "neutral": ("held its annual meeting", "was unchanged", "named a new auditor", "traded flat",
                "published its calendar"),
}
_FIN_TAILS = ("in early trading", "on Tuesday", "after the report", "this quarter", "in Helsinki")

_MED_INSTRUCTION = "Answer this question truthfully"
_MED_TERMS = {
    "tachycardia": "a heart rate above 100 beats per minute",
    "bradycardia": "a heart rate below 60 beats per minute",
    "anemia": "a low level of red blood cells or hemoglobin",
    "hypoxia": "a low level of oxygen in the tissues",
    "edema": "swelling caused by fluid in the tissues",
    "fever": "a body temperature above 38 degrees Celsius",
    "hypertension": "a blood pressure that stays above 130/80 mmHg",
    "hypoglycemia": "a blood glucose level below 70 mg/dL",
    "dyspnea": "the feeling of shortness of breath",
    "jaundice": "yellow skin caused by a high bilirubin level",
}
_MED_QUESTIONS = ("What is {}?", "What does the term {} mean?", "Define {}.")

_CODE_OPS = {"sum": "+", "difference": "-", "product": "*"}


def _general_nlp(rng: random.Random) -> dict[str, str]:
    word = rng.choice(_WORDS)
    kind = rng.randrange(4)
    if kind == 0:
        instruction, output = f"Write the word {word} in capital letters.", word.upper()
    elif kind == 1:
        instruction, output = f"Repeat the word {word} twice.", f"{word} {word}"
    elif kind == 2:
        instruction, output = f"What is the first letter of {word}?", f"The first letter of {word} is {word[0]}."
    else:
        instruction, output = f"How many letters are in the word {word}?", f"The word {word} has {len(word)} letters."
    # The input column exists in the schema but general NLP ignores it: fill it with an unrelated distractor.
    return {"instruction": instruction, "input": rng.choice(("", rng.choice(_WORDS))), "output": output}


def _finance(rng: random.Random) -> dict[str, str]:
    label = rng.choice(tuple(_FIN_VERBS))
    sentence = f"{rng.choice(_FIN_COMPANIES)} {rng.choice(_FIN_VERBS[label])} {rng.choice(_FIN_TAILS)}."
    return {"instruction": _FIN_INSTRUCTION, "input": sentence, "output": label}


def _medical(rng: random.Random) -> dict[str, str]:
    term = rng.choice(tuple(_MED_TERMS))
    question = rng.choice(_MED_QUESTIONS).format(term)
    return {"instruction": _MED_INSTRUCTION, "input": question,
            "output": f"{term.capitalize()} is {_MED_TERMS[term]}."}


def _code(rng: random.Random) -> dict[str, str]:
    a, b = rng.randrange(1, 20), rng.randrange(1, 20)
    kind = rng.randrange(3)
    if kind == 0:
        name = rng.choice(tuple(_CODE_OPS))
        op = _CODE_OPS[name]
        return {"instruction": f"Write a Python function that returns the {name} of two numbers.", "input": "",
                "output": f"def {name}(a, b):\n    return a {op} b"}
    if kind == 1:
        name = rng.choice(tuple(_CODE_OPS))
        return {"instruction": f"Print the {name} of the two numbers.", "input": f"a = {a}, b = {b}",
                "output": f"a = {a}\nb = {b}\nprint(a {_CODE_OPS[name]} b)"}
    word = rng.choice(_WORDS)
    return {"instruction": "Write Python code that prints the string in reverse.", "input": word,
            "output": f"print({word!r}[::-1])"}


_MAKERS = {"general-nlp": _general_nlp, "finance": _finance, "medical": _medical, "code": _code}


def make_rows(domain: str, n_rows: int, seed: int) -> list[dict[str, str]]:
    """``n_rows`` seeded rows with columns ``instruction``, ``input``, ``output`` for ``domain``."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    rng = random.Random(f"kfca-synthetic/{domain}/{seed}")
    make = _MAKERS[domain]
    return [make(rng) for _ in range(n_rows)]
