"""Texts (``data=text``): files of texts read, a tokenizer fitted or given, token ids held.

dataset    the builder: texts and targets read, split, tokenized into ids [N, L]
files      texts read from CSV/TSV, JSON lines or class folders, strictly as UTF-8
tokenizer  the tokenizer: trained on the train split, cached, stored, read as untrusted
tokenizer_trust  is a tokenizer from elsewhere safe to run, and the same each time?
inputs     Tokens: what token ids answer (batches, the record, predict.py, exports)
"""
