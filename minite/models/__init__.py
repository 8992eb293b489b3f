"""Tokenizer and model builders for the tiny reproduction."""
