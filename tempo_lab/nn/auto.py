"""``tl.nn.AutoModel.from_pretrained(path)``: the checkpoints people download, dispatched on
``config.json``'s ``model_type`` as ``transformers``' ``AutoModelForCausalLM`` does.

- ``llama``: ``tl.nn.Llama`` (``tl.nn.checkpoint``);
- ``qwen2`` (Qwen2, Qwen2.5): the same decoder with biases on the q, k and v projections;
- ``mistral``: the same decoder with a sliding window (``sliding_window``: keys and values read
  over the last ``window`` steps, so the compiler keeps a ring of that many, not the history);
- ``gpt2``: ``tl.nn.GPT2`` (learned positions, LayerNorm, GELU, fused ``c_attn``), its
  ``Conv1D`` weights read ``(in, out)`` as stored, with or without the ``transformer.`` prefix.

Every numeric field a model reads is checked against its table of rules before use; a field
the model cannot honour (another activation, attention that differs by layer, an untied GPT-2
head) or another ``model_type`` is a ``CheckpointError`` naming the field. A path may also be a
Hugging Face Hub id already in the local cache (``tl.nn.hub``).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, TempoLabError, user_api
from .checkpoint import (
    LLAMA_NAMES,
    POSITIVE,
    SIZE,
    Names,
    Rule,
    _kind,
    _value,
    llama_from_config,
    load_weights,
    number,
    read_config,
)
from .gpt2 import GPT2
from .hub import resolve

COUNT = Rule(True, 0, high=2**31 - 1)
GPT2_FIELDS = {"vocab_size": SIZE, "n_embd": SIZE, "n_layer": SIZE, "n_head": SIZE,
               "n_positions": SIZE, "n_inner": SIZE, "layer_norm_epsilon": POSITIVE}
GPT2_LAYER = {"norm1.scale": "ln_1.weight", "norm1.bias": "ln_1.bias",
              "attn.w_qkv": "attn.c_attn.weight", "attn.b_qkv": "attn.c_attn.bias",
              "attn.w_o": "attn.c_proj.weight", "attn.b_o": "attn.c_proj.bias",
              "norm2.scale": "ln_2.weight", "norm2.bias": "ln_2.bias",
              "mlp.w_fc": "mlp.c_fc.weight", "mlp.b_fc": "mlp.c_fc.bias",
              "mlp.w_proj": "mlp.c_proj.weight", "mlp.b_proj": "mlp.c_proj.bias"}
# the causal-mask buffers older GPT-2 files hold, and the head tied to the embedding
GPT2_IGNORED = (".attn.bias", ".attn.masked_bias", "lm_head.weight")


def _window(cfg: dict, where: str) -> int | None:
    """The sliding window every layer uses, or None for full attention in every layer: from
    ``layer_types`` (transformers 5), else ``use_sliding_window`` / ``max_window_layers``
    (Qwen2 in transformers 4), else ``sliding_window`` itself (Mistral)."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(x, str) for x in types):
            raise CheckpointError(f"{where}: field 'layer_types' is {_value(types)}; give a "
                                  "list of strings")
        kinds = set(types)
        if kinds <= {"full_attention"}:
            return None
        if kinds == {"sliding_attention"}:
            return number(cfg, "sliding_window", SIZE, where)
        raise CheckpointError(f"{where}: field 'layer_types' mixes {sorted(kinds)}; a tl.nn "
                              "decoder has one attention for every layer")
    if cfg.get("model_type") == "qwen2":
        if not cfg.get("use_sliding_window", False):
            return None
        layers = number(cfg, "num_hidden_layers", SIZE, where)
        below = number(cfg, "max_window_layers", COUNT, where)
        if below >= layers:
            return None
        if below > 0:
            raise CheckpointError(f"{where}: max_window_layers {below} makes the first {below} "
                                  "layers attend fully and the rest over a window; a tl.nn "
                                  "decoder has one attention for every layer")
    return number(cfg, "sliding_window", SIZE, where, default=0) or None


def qwen2_from_config(cfg: dict, where: str):
    return llama_from_config(cfg, where, qkv_bias=True, window=_window(cfg, where))


def mistral_from_config(cfg: dict, where: str):
    return llama_from_config(cfg, where, window=_window(cfg, where))


def gpt2_from_config(cfg: dict, where: str) -> GPT2:
    """The ``GPT2`` a transformers ``GPT2Config`` describes, or a ``CheckpointError`` naming
    the field it cannot honour."""
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"{where}: activation_function is {_value(act)}; tl.nn.GPT2 "
                              "applies GELU's tanh approximation ('gelu_new')")
    for name, fine in (("scale_attn_by_inverse_layer_idx", False),
                       ("add_cross_attention", False), ("scale_attn_weights", True),
                       ("tie_word_embeddings", True)):
        if cfg.get(name, fine) is not fine:
            raise CheckpointError(f"{where}: {name} is {_value(cfg[name])}, which tl.nn.GPT2 "
                                  f"cannot honour (it has {name} = {fine!r})")

    def size(name, default=None):
        return number(cfg, name, GPT2_FIELDS[name], where, default)

    try:
        return GPT2(vocab=size("vocab_size"), embed=size("n_embd"), layers=size("n_layer"),
                    heads=size("n_head"), positions=size("n_positions"),
                    hidden=size("n_inner", 0) or None, eps=size("layer_norm_epsilon", 1e-5))
    except TempoLabError as e:  # sizes that do not fit together
        raise CheckpointError(f"{where}: {e.reason}") from None


def gpt2_names(tensors) -> Names:
    """GPT-2's names, with the ``transformer.`` prefix of ``GPT2LMHeadModel`` files or without
    it (files saved from ``GPT2Model``, as the original GPT-2 checkpoints are)."""
    p = "transformer." if "transformer.wte.weight" in tensors else ""
    return Names(p + "h.{}.", GPT2_LAYER, {"embed.w": p + "wte.weight",
                                           "pos.w": p + "wpe.weight",
                                           "norm.scale": p + "ln_f.weight",
                                           "norm.bias": p + "ln_f.bias"}, GPT2_IGNORED)


ARCHITECTURES = {   # model_type -> (config reader, where its tensors are)
    "llama": (llama_from_config, LLAMA_NAMES),
    "qwen2": (qwen2_from_config, LLAMA_NAMES),
    "mistral": (mistral_from_config, LLAMA_NAMES),
    "gpt2": (gpt2_from_config, gpt2_names),
}


class AutoModel:
    """``model, params = tl.nn.AutoModel.from_pretrained(path)``: the decoder a checkpoint's
    ``config.json`` names (see the module) and its parameters."""

    @staticmethod
    @user_api
    def from_pretrained(path, dtype=None):
        """``(model, params)`` of a checkpoint directory (or a cached Hub id), the checkpoint's
        dtype kept unless ``dtype`` is given."""
        path = resolve(path, "tl.nn.AutoModel.from_pretrained")
        cfg_file = (path if _kind(path) == "dir" else Path(path).parent) / "config.json"
        cfg = read_config(cfg_file)
        kind = cfg.get("model_type")
        if not isinstance(kind, str) or kind not in ARCHITECTURES:
            what = "missing" if "model_type" not in cfg else _value(kind)
            raise CheckpointError(f"{cfg_file}: field 'model_type' is {what}; "
                                  f"tl.nn.AutoModel reads {', '.join(ARCHITECTURES)}")
        reader, names = ARCHITECTURES[kind]
        model = reader(cfg, str(cfg_file))
        return model, load_weights(path, model, names, dtype,
                                   "tl.nn.AutoModel.from_pretrained")
