"""Tables: rows of named columns in a CSV or TSV file, encoded into one float tensor [N, F].

tabular         the builder (data=csv): a table read, split, encoded, its gaps filled
table           a CSV's rows as columns encoded into one float tensor, read alike later
target_columns  a file's target column(s) read by the task's kind, for every reader of rows
missing         gaps in a table: refused, filled, or flagged (data.na_*)
column_kinds    data.categorical=auto: which columns are categories, which identifiers
inputs          Rows: what rows of features answer (model hints, the record, predict.py)
"""
