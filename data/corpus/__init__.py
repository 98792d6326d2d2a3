"""A corpus (``data=corpus``): one stream of token ids for a language model.

corpus      the builder: a text file, folder or column read, split, tokenized once
parquet     a corpus in Parquet shards, local or on object storage: a text or a token-id column
vocabulary  how text becomes ids and back: characters, bytes, a BPE; stored, read as untrusted
cache       the ids kept in a file later runs memory-map: made once, checked, made again
stream      the windows of block_size + 1 tokens, in an order of (seed, pass), and their batches
inputs      Stream: what a stream's ids answer (batches, the record, what predict.py refuses)
"""
