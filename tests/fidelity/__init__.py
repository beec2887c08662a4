"""Fidelity tier (see conftest.py).

A package on purpose: its conftest then imports as ``fidelity.conftest`` and
leaves the top-level ``conftest`` module name to ``tests/conftest.py``, which
other test modules import helpers from (``from conftest import run_engine``).
"""
