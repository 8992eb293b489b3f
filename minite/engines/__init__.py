"""Trainer and sampler engines, and what crosses between them."""
