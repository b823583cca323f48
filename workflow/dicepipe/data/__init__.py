"""Corpus sources, the normalised sample schema, prompts and CuKe assembly."""
