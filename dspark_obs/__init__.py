"""dspark-obs: make DSpark speculative decoding in SGLang observable.

Collect per-step verify windows, confidences and accepted lengths from a running
SGLang DSpark server (or the embedded emulator) into Parquet, query them with
DuckDB, and reconstruct what trimming hides.
"""

__version__ = "0.1.0"
