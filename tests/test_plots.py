import numpy as np
import pytest
from PIL import Image

from kfca_llm.plots import plot_delta, plot_rewards, strategy_colour, strategy_style


def _report(domain: str, seed: int, rounds: int = 4):
    rng = np.random.default_rng(seed)
    strategies = {}
    for spec, level in (("honest", 0.3), ("lagged:2", 0.1), ("sparse:0.5", 0.15), ("flip", -0.3), ("zero", 0.0)):
        per_round = (level + 0.02 * rng.standard_normal(rounds)).tolist()
        strategies[spec] = {"mean_reward": float(np.mean(per_round)), "per_round": per_round}
    deltas = []
    for _ in range(rounds):
        d = float(rng.uniform(0.05, 0.2))
        deltas.append([[d, -d], [-d, d]])
    return {"domain": domain, "seed": seed, "rounds": rounds, "strategies": strategies,
            "categorical_world": [True] * (rounds - 1) + [False], "delta": deltas}


def _image(path):
    with Image.open(path) as img:
        assert img.format == "PNG"
        return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("n_domains", [1, 4])
def test_figures_are_written_with_one_panel_per_domain(tmp_path, n_domains):
    reports = [_report(d, i) for i, d in enumerate(["general-nlp", "finance", "medical", "code"][:n_domains])]
    plot_rewards(reports, tmp_path / "rewards.png")
    plot_delta(reports, tmp_path / "delta.png")
    rewards, delta = _image(tmp_path / "rewards.png"), _image(tmp_path / "delta.png")
    # More domains: wider reward figure (columns), taller delta figure (rows).
    assert rewards.shape[1] > 700 * n_domains
    assert delta.shape[0] > 150 * n_domains
    assert rewards.std() > 10 and delta.std() > 10  # not blank
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def _colour_counts(path):
    img = _image(path).reshape(-1, 3).astype(int)
    r, g, b = img[:, 0], img[:, 1], img[:, 2]
    return {"green": ((g > r + 40) & (g > b + 40)).sum(), "red": ((r > g + 40) & (r > b + 40)).sum(),
            "blue": ((b > r + 40) & (b > g + 20)).sum()}


def test_delta_colours_follow_the_sign_and_the_condition(tmp_path):
    report = _report("finance", 3, rounds=3)
    report["categorical_world"] = [True, True, True]
    plot_delta([report], tmp_path / "holds.png")
    holds = _colour_counts(tmp_path / "holds.png")
    # positive diagonal blue, negative off-diagonal red (diverging map), bars green where d > 0
    assert holds["blue"] > 1000 and holds["red"] > 1000 and holds["green"] > 1000
    for d in report["delta"]:
        d[0][0] = d[1][1] = -0.01
        d[0][1] = d[1][0] = 0.01
    report["categorical_world"] = [False] * 3
    plot_delta([report], tmp_path / "broken.png")
    broken = _colour_counts(tmp_path / "broken.png")
    assert broken["green"] < holds["green"] / 10 and broken["red"] > holds["red"]


def test_families_have_distinct_line_styles_and_markers():
    families = ["honest", "stale", "lagged:2", "sparse:0.5", "flip", "zero", "random", "free-ride:1", "my-attack"]
    styles = {spec: strategy_style(spec) for spec in families}
    assert len({str(v) for v in styles.values()}) == len(families)
    assert strategy_style("lagged:2") == strategy_style("lagged:5")
    assert strategy_style("free-ride:1") == strategy_style("free-ride-noise:0.05") == strategy_style("free-ride-flip:2")


def test_strategy_colours_group_families():
    assert strategy_colour("honest") != strategy_colour("flip")
    assert len({strategy_colour(f"lagged:{k}") for k in (2, 3, 4, 5)}) == 4
    assert strategy_colour("sparse:0.25") != strategy_colour("sparse:0.75")
    assert strategy_colour("my-attack")  # user attacks get a colour too
    riders = ["free-ride:1", "free-ride-flip:1", "free-ride-noise:0.05", "free-ride-signs:1"]
    assert len({strategy_colour(spec) for spec in [*riders, "my-attack", "flip"]}) == len(riders) + 2
