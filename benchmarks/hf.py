"""``transformers`` as a third reference for the decode benchmark (``--systems hf_generate``):
``LlamaForCausalLM.generate`` around the benchmark's own arrays, on the CPU with PyTorch.

Optional: it needs ``transformers`` and ``torch`` (``pip install -e ".[bench]"``); the tests never
import it. The model is built on PyTorch's ``meta`` device and its parameters are then the
benchmark's NumPy arrays themselves (``torch.from_numpy``: the weights are held once, as the
other systems hold them); matrices are ``(out, in)`` in both.
"""
from __future__ import annotations

import numpy as np


def _config(model):
    from transformers import LlamaConfig

    s = model.rope_scaling
    scaling = None if s is None else {
        "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
        "high_freq_factor": s.high_freq_factor,
        "original_max_position_embeddings": s.original_max_position_embeddings}
    return LlamaConfig(vocab_size=model.vocab, hidden_size=model.embed,
                       intermediate_size=model.hidden, num_hidden_layers=model.layers,
                       num_attention_heads=model.heads, num_key_value_heads=model.kv_heads,
                       head_dim=model.head_dim, rms_norm_eps=model.eps,
                       tie_word_embeddings=model.tied, rope_theta=model.rope_base,
                       rope_scaling=scaling, max_position_embeddings=1 << 17,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _tensor(a: np.ndarray):
    import torch

    if a.dtype.name == "bfloat16":   # ml_dtypes' bfloat16: the same bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def state_dict(model, params: dict) -> dict:
    """Our parameter dict under the Hugging Face names (views, no copies)."""
    from tempo_lab.nn.checkpoint import GLOBAL_NAMES, HF_NAMES

    out = {}
    for k, v in params.items():
        if k.startswith("layers."):
            for j in range(model.layers):
                out[f"model.layers.{j}.{HF_NAMES[k[len('layers.'):]]}"] = _tensor(v[j])
        else:
            out[GLOBAL_NAMES[k]] = _tensor(v)
    return out


def greedy(model, params: dict):
    """``generate(prompt, steps) -> ids (B, steps)``: the prompt's tokens, then greedy ones."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if model.window is not None:
        raise SystemExit("hf_generate: transformers' Llama has no attention window")
    config = _config(model)
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    hf.load_state_dict(state_dict(model, params), strict=not model.tied, assign=True)
    if model.tied:
        hf.tie_weights()
    hf.model.rotary_emb = LlamaRotaryEmbedding(config)   # its frequencies, on the CPU
    hf.eval()

    def generate(prompt: np.ndarray, steps: int) -> np.ndarray:
        ids = torch.as_tensor(prompt)
        new = steps - ids.shape[1]
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, pad_token_id=0)
        return out.numpy().astype(np.int32)
    return generate
