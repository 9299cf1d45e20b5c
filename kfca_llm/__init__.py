"""kfca-llm: Knowledge-Free Correlated Agreement rewards for federated LLM adapter tuning.

Every adapter coordinate is a task and a client's report is the sign of its update there; a
client earns agreement with a peer on bonus coordinates minus agreement between two different
penalty coordinates (the paper's multi-task peer prediction with the KFCA score 1{r1 == r2}).
"""

from .api import score_checkpoints, score_labels, score_updates
from .errors import InputError
from .packer import SignPacker
from .report import RewardReport

__version__ = "0.1.0"

__all__ = ["InputError", "RewardReport", "SignPacker", "score_checkpoints", "score_labels", "score_updates"]
