"""Generators of the tiny samples (`python -m recipes.samples.make_tiny`, `python -m recipes.samples.make_tiny_sft`)."""
