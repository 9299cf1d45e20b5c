"""kfca-llm: Knowledge-Free Correlated Agreement rewards for federated LLM adapter tuning."""

__version__ = "0.1.0"
