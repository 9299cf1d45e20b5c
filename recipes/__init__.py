"""Recipe files (FlowerTune key names), installed as the data package kfca_llm.recipes."""
