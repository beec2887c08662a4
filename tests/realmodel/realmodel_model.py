"""The real model's pieces: the ragged forward against transformers, the coupling's law, the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark_obs.emulator.realmodel import coupling, weights
from dspark_obs.emulator.realmodel.pair import ModelPair


@pytest.fixture(scope="module")
def pair() -> ModelPair:
    return ModelPair.get()


def test_ragged_cached_forward_matches_transformers(pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    loaded = weights.load()
    hf = LlamaForCausalLM(LlamaConfig(**loaded.config)).eval()
    hf.load_state_dict({**loaded.state, "lm_head.weight": loaded.state["model.embed_tokens.weight"]}, strict=False)
    a = pair.encode("What is 17 times 23?")
    b = pair.encode("Write a haiku about autumn leaves.")
    with torch.inference_mode():
        ref_a, ref_b = (hf(torch.tensor([ids])).logits[0] for ids in (a, b))
        caches = [pair.new_caches(64), pair.new_caches(64)]
        # Two requests of different lengths packed in one forward, then the rest of each in a second one.
        first, _, _ = pair.forward([a[:5], b[:11]], caches, drafter=False)
        second, _, _ = pair.forward([a[5:], b[11:]], caches, drafter=False)
    mine_a = torch.cat([first[:5], second[:len(a) - 5]])
    mine_b = torch.cat([first[5:], second[len(a) - 5:]])
    assert (mine_a - ref_a).abs().max() < 1e-3
    assert (mine_b - ref_b).abs().max() < 1e-3


def test_drafter_is_the_target_without_its_dropped_layers(pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    loaded = weights.load()
    cfg = dict(loaded.config, num_hidden_layers=len(pair.drafter_layers))
    keep = {f"model.layers.{old}.": f"model.layers.{new}." for new, old in enumerate(pair.drafter_layers)}
    state = {}
    for name, value in loaded.state.items():
        for old, new in keep.items():
            if name.startswith(old):
                state[name.replace(old, new)] = value
        if not name.startswith("model.layers."):
            state[name] = value
    hf = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    hf.load_state_dict({**state, "lm_head.weight": loaded.state["model.embed_tokens.weight"]}, strict=False)
    ids = pair.encode("Explain the difference between a process and a thread.")
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
        _, draft, _ = pair.forward([ids], [pair.new_caches(64)])
    assert (draft - ref).abs().max() < 1e-3
    assert pair.drop == (16, 17) and 16 not in pair.drafter_layers


def test_the_dequantised_copy_is_cached_and_read_back_equal():
    first = weights.load()  # builds the cache on a fresh machine, reads it otherwise
    again = weights.load()
    assert again.source == "cache"
    assert (weights.default_cache_dir() / weights.MODEL_NAME / "model.safetensors").is_file()
    assert all(torch.equal(first.state[k], again.state[k]) for k in ("model.norm.weight", "model.layers.3.mlp.up_proj.weight"))


def test_coupling_keeps_the_draft_marginal_and_accepts_with_min_p_over_q():
    p = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    n = 40_000
    keys = list(range(n))
    u = {purpose: coupling.uniforms(3, keys, [0] * n, purpose) for purpose in ("target", "couple", "residual")}
    x = coupling.inverse_cdf(p.expand(n, 3), u["target"])
    d = coupling.couple(p.expand(n, 3), q.expand(n, 3), x, u["couple"], u["residual"])
    x, d = x.numpy(), d.numpy()
    assert np.allclose(np.bincount(x, minlength=3) / n, p[0].numpy(), atol=0.01)
    assert np.allclose(np.bincount(d, minlength=3) / n, q[0].numpy(), atol=0.01)
    assert abs((d == x).mean() - torch.minimum(p, q).sum().item()) < 0.01
    for tok in range(3):  # P(accept | d) = min(1, p(d) / q(d))
        assert abs((x[d == tok] == tok).mean() - min(1.0, p[0, tok].item() / q[0, tok].item())) < 0.02


def test_keyed_uniforms_depend_on_every_part_of_the_key():
    base = coupling.keyed_uniform(0, 7, 3, "target")
    assert base == coupling.keyed_uniform(0, 7, 3, "target")
    others = {coupling.keyed_uniform(1, 7, 3, "target"), coupling.keyed_uniform(0, 8, 3, "target"),
              coupling.keyed_uniform(0, 7, 4, "target"), coupling.keyed_uniform(0, 7, 3, "couple")}
    assert base not in others and len(others) == 4


def test_head_transform_and_sts_map_the_drafter_probability():
    q = np.array([[0.5, 0.9, 0.2]])
    assert np.allclose(coupling.head_confidence(q, None, None), q)
    logit = np.log(q / (1 - q))
    shifted = coupling.head_confidence(q, (0.5, 1.0), None)
    assert np.allclose(shifted, 1 / (1 + np.exp(-(0.5 * logit + 1.0))))
    sts = coupling.head_confidence(q, None, np.array([2.0, 2.0, 2.0]))
    assert np.allclose(sts, 1 / (1 + np.exp(-logit / 2.0)))
