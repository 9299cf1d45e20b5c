"""Contribution valuation: Shapley values, their estimators, and the reward-fidelity experiment.

``shapley_exact`` / ``shapley_tmc`` / ``shapley_gtg`` / ``shapley_group_testing`` work on any cooperative game (players
``0..n-1``, a utility on frozensets of players); ``kfca_llm.valuation.fidelity`` compares KFCA's
rewards with them on a federated image-classification run (``kfca-llm fidelity``).
"""

from .exact import shapley_exact, shapley_from_table
from .group_testing import GroupTestingEstimate, shapley_group_testing
from .sampling import ShapleyEstimate, mean_relative_change, shapley_gtg, shapley_tmc
from .utility import CachedUtility

__all__ = ["CachedUtility", "GroupTestingEstimate", "ShapleyEstimate", "mean_relative_change", "shapley_exact",
           "shapley_from_table", "shapley_group_testing", "shapley_gtg", "shapley_tmc"]
