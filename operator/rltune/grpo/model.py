"""The policy model: a small Qwen2-shaped causal LM built from the trial's architecture.

Nothing is downloaded: the same config.json feeds vLLM (load_format="dummy", weights then pushed
from the trainer) and transformers' Qwen2ForCausalLM (randomly initialised, then briefly
pre-trained on the task's format so RL has signal).
"""

from __future__ import annotations

import json
import os

from rltune.api.models import ModelArch

from .task import BOS, EOS, MIN_VOCAB, PAD

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def qwen2_config(arch: ModelArch, max_len: int) -> dict:
    """config.json of a Qwen2ForCausalLM with the architecture's dense shape."""
    if arch.is_moe or arch.is_mla:
        raise ValueError(
            f"real mode runs dense GQA (Qwen2-shaped) models only; model {arch.name!r} is "
            f"{'MoE' if arch.is_moe else 'MLA'}: use the twin, or give a dense shape"
        )
    if arch.vocab < MIN_VOCAB:
        raise ValueError(f"real mode's task needs a vocabulary of at least {MIN_VOCAB} tokens (got {arch.vocab})")
    if arch.heads % arch.kv_heads:
        raise ValueError(f"heads ({arch.heads}) must be a multiple of kvHeads ({arch.kv_heads})")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.ffn or 4 * arch.hidden,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
        "head_dim": arch.head_dim,
        "max_position_embeddings": max(64, max_len),
        "max_window_layers": arch.layers,
        "use_sliding_window": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": DTYPES[arch.dtype],
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def write_model_dir(cfg: dict, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    # A generation config keeps vLLM from looking for one elsewhere.
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}, f)
    return path


def build_trainer_model(cfg: dict):
    """transformers' Qwen2ForCausalLM for the config, fp32 master weights (computing in the served
    dtype on a GPU: rltune.grpo.loop.token_logprobs)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    conf = Qwen2Config(**hf)
    conf._attn_implementation = "sdpa"
    conf.compute_dtype = cfg.get("torch_dtype", "float32")  # the dtype vLLM serves: the GPU forward's autocast
    model = Qwen2ForCausalLM(conf)
    return model.to(torch.float32)
