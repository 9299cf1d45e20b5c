"""Scoring engine: packed sign bits, backends and streaming."""
