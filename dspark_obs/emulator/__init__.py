"""A protocol-faithful DSpark server for machines without a GPU.

``model`` is the stochastic target/drafter/confidence head, ``engine`` runs
continuous batching with SGLang's scheduler and verify modes, ``dumper`` keeps
SGLang's debug-dump semantics, and ``server`` speaks SGLang's HTTP endpoints.
"""
