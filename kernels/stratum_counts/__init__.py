"""Negative counts per task set and public stratum: ``popcount(sign_i & set & stratum_s)`` (issue 43)."""
