"""Hugging Face Llama checkpoints: ``config.json`` to a ``tl.nn.Llama``, safetensors to its
parameter dict.

``from_pretrained(path)`` reads a checkpoint directory as ``transformers`` writes it:
``config.json`` in the layout of transformers 4 (``rope_theta`` and ``rope_scaling`` at the top)
or 5 (both inside ``rope_parameters``), and the weights in ``model.safetensors`` or in shards
listed by ``model.safetensors.index.json``. Tensors are read one at a time through the
``safetensors`` package (its ``safe_open`` maps the file; shapes and dtypes are checked from
the header before any data is read) and copied once, into their place in an aligned array
stacked over layers, in the checkpoint's dtype (bfloat16 stays bfloat16) unless ``dtype`` asks
for another. Matrices keep their ``(out, in)`` layout (``tl.nn.Llama`` takes them so).

Anything the model cannot honour (a bias, another activation or RoPE type, a missing or extra
tensor, a layer count that differs, a file that is not a safetensors file) is a
``CheckpointError`` that names the file and the field or tensor.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ..errors import CheckpointError, TempoLabError
from ..ir.ops import shape_str
from ..runtime.host import aligned_empty
from .attention import RopeScaling
from .llama import Llama, floating_dtype

HF_NAMES = {   # ours (per layer) -> the Hugging Face name; matrices are (out, in) in both
    "norm1.scale": "input_layernorm.weight",
    "attn.wq": "self_attn.q_proj.weight",
    "attn.wk": "self_attn.k_proj.weight",
    "attn.wv": "self_attn.v_proj.weight",
    "attn.wo": "self_attn.o_proj.weight",
    "norm2.scale": "post_attention_layernorm.weight",
    "mlp.w_gate": "mlp.gate_proj.weight",
    "mlp.w_up": "mlp.up_proj.weight",
    "mlp.w_down": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"embed.w": "model.embed_tokens.weight", "norm.scale": "model.norm.weight",
                "head.w": "lm_head.weight"}
IGNORED = ("rotary_emb.inv_freq",)  # buffers older checkpoints saved; recomputed here
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


# -- config.json --------------------------------------------------------------------------------
def read_config(path) -> dict:
    """``config.json`` of a checkpoint directory (or the file itself) as a dict."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: no config.json; a Hugging Face checkpoint directory "
                              "holds config.json beside its safetensors files") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: config.json must hold a JSON object, got "
                              f"{type(cfg).__name__}")
    return cfg


def llama_from_config(cfg: dict, where: str = "config.json") -> Llama:
    """The ``Llama`` a transformers ``LlamaConfig`` describes (either layout), or a
    ``CheckpointError`` naming the field it cannot honour."""
    def field(name, kind, default=None, required=True):
        v = cfg.get(name, default)
        if v is None and not required:
            return None
        ok = isinstance(v, kind) and not isinstance(v, bool) and v > 0 if kind is not bool \
            else isinstance(v, bool)
        if not ok:
            what = "missing" if name not in cfg else f"{v!r}"
            need = "true or false" if kind is bool else \
                f"a positive {getattr(kind, '__name__', 'number')}"
            raise CheckpointError(f"{where}: field {name!r} is {what}; a Llama config needs it "
                                  f"as {need}")
        return v

    kind = cfg.get("model_type")
    if kind not in (None, "llama"):
        raise CheckpointError(f"{where}: model_type is {kind!r}; tl.nn.Llama reads Llama "
                              "checkpoints (model_type 'llama')")
    for name, fine in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"),
                       ("pretraining_tp", 1)):
        if name in cfg and cfg[name] not in (fine, None):
            raise CheckpointError(f"{where}: {name} is {cfg[name]!r}, which tl.nn.Llama cannot "
                                  f"honour (it has {name} = {fine!r})")
    rope = _rope(cfg, where)
    heads = field("num_attention_heads", int)
    try:
        return Llama(vocab=field("vocab_size", int), embed=field("hidden_size", int),
                     layers=field("num_hidden_layers", int), heads=heads,
                     kv_heads=field("num_key_value_heads", int, heads),
                     hidden=field("intermediate_size", int),
                     rope_base=float(rope.get("rope_theta", 10000.0)),
                     eps=float(field("rms_norm_eps", (int, float), 1e-6)),
                     tied=field("tie_word_embeddings", bool, False),
                     head_dim=field("head_dim", int, None, required=False),
                     rope_scaling=_scaling(rope, where))
    except CheckpointError:
        raise
    except TempoLabError as e:  # sizes that do not fit together (heads and widths)
        raise CheckpointError(f"{where}: {e.reason}") from None


def _rope(cfg: dict, where: str) -> dict:
    """The RoPE fields of either layout as one dict (``rope_theta``, ``rope_type``, ...)."""
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{where}: rope_parameters must be an object or null, got "
                              f"{params!r}")
    if isinstance(params, dict) and "rope_theta" not in params and params:  # per layer type
        raise CheckpointError(f"{where}: rope_parameters per layer type are not supported")
    out = dict(params or {})
    if "rope_theta" in cfg:
        out.setdefault("rope_theta", cfg["rope_theta"])
    old = cfg.get("rope_scaling")
    if old is not None and not isinstance(old, dict):
        raise CheckpointError(f"{where}: rope_scaling must be an object or null, got {old!r}")
    out.update(old or {})
    if "type" in out and "rope_type" not in out:  # the oldest spelling
        out["rope_type"] = out["type"]
    theta = out.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 1:
        raise CheckpointError(f"{where}: rope_theta is {theta!r}; give a number > 1")
    return out


def _scaling(rope: dict, where: str) -> RopeScaling | None:
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{where}: rope_type {kind!r} is not supported; tl.nn.Llama "
                              "applies 'default' and Llama 3's 'llama3' scaling")
    names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in names if not isinstance(rope.get(k), (int, float))
               or isinstance(rope.get(k), bool)]
    if missing:
        raise CheckpointError(f"{where}: llama3 RoPE scaling needs {', '.join(missing)} as "
                              f"numbers, got {({k: rope.get(k) for k in missing})}")
    try:
        return RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                           float(rope["high_freq_factor"]),
                           int(rope["original_max_position_embeddings"]))
    except TempoLabError as e:
        raise CheckpointError(f"{where}: {e.reason}") from None


# -- safetensors --------------------------------------------------------------------------------
def shard_files(path) -> list[Path]:
    """The safetensors files of a checkpoint: a file given itself, or a directory's
    ``model.safetensors`` or the shards its ``model.safetensors.index.json`` lists."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            weight_map = None
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        files = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        if not files or not all(isinstance(f, str) and f and os.sep not in f for f in files):
            raise CheckpointError(f"{index}: not an index of shards (a JSON object whose "
                                  "'weight_map' maps tensor names to file names)")
        out = [path / f for f in files]
        absent = [str(f) for f in out if not f.is_file()]
        if absent:
            raise CheckpointError(f"{index}: lists shards that are not there: "
                                  f"{', '.join(absent)}")
        return out
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    raise CheckpointError(f"{path}: neither {SINGLE} nor {INDEX} is there")


class _Tensors:
    """Every tensor of some safetensors files by name, opened with ``safe_open`` (headers
    read, data read on ``get``)."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self.files, self.where = [], {}
        for file in files:
            try:
                f = safe_open(os.fspath(file), framework="numpy")
                keys = list(f.keys())
            except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: the file's fault
                raise CheckpointError(f"{file}: not a readable safetensors file "
                                      f"({type(e).__name__}: {e})") from None
            self.files.append(f)
            for k in keys:
                self.where[k] = (f, file)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        f, file = self.where[name]
        sl = f.get_slice(name)
        try:
            dt = np.dtype(_DTYPES[sl.get_dtype()])
        except KeyError:
            raise CheckpointError(f"{file}: tensor {name!r} has dtype {sl.get_dtype()}; "
                                  "give floating weights (F32, BF16, F16)") from None
        return tuple(sl.get_shape()), dt

    def get(self, name: str) -> np.ndarray:
        f, file = self.where[name]
        try:
            return f.get_tensor(name)
        except Exception as e:  # noqa: BLE001 - a truncated or corrupt file
            raise CheckpointError(f"{file}: tensor {name!r} cannot be read "
                                  f"({type(e).__name__}: {e})") from None

    def file_of(self, name: str) -> Path:
        return self.where[name][1]


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}


def _plan(model: Llama) -> dict[str, list[str]]:
    """Ours -> the checkpoint's names (one per layer for ``layers.*``)."""
    return {ours: [f"model.layers.{k}.{HF_NAMES[ours[len('layers.'):]]}"
                   for k in range(model.layers)] if ours.startswith("layers.")
            else [GLOBAL_NAMES[ours]] for ours in model.shapes()}


def _layers_present(names) -> int:
    """How many layers ``model.layers.0.*``, ``model.layers.1.*``, ... the names hold, counted
    up to the first index that has no tensor."""
    found = {int(n.split(".")[2]) for n in names
             if n.startswith("model.layers.") and n.split(".")[2].isdigit()}
    return next(k for k in range(len(found) + 1) if k not in found)


def load_llama(paths, model: Llama, dtype=None) -> dict[str, np.ndarray]:
    """``model``'s parameters from safetensors files in the Hugging Face Llama layout (one file,
    a list of shards, or a checkpoint directory), in ``dtype`` (default: the checkpoint's, the
    widest of its tensors' dtypes). Every tensor is checked against ``model`` before any is
    read: a missing, extra or misshapen tensor (another layer count, an untied head for a tied
    model) is a ``CheckpointError``."""
    if isinstance(paths, (str, os.PathLike)):
        files = shard_files(paths)
    else:
        files = [Path(p) for p in paths]
        for p in files:
            if not p.is_file():
                raise CheckpointError(f"{p}: no such checkpoint file")
    tensors = _Tensors(files)
    where = files[0] if len(files) == 1 else files[0].parent
    layers = _layers_present(tensors.where)
    if model.layers > layers:  # before any name is listed: a config may say 10**12 layers
        name = f"model.layers.{layers}.{HF_NAMES['norm1.scale']}"
        raise CheckpointError(f"{where}: the checkpoint has no tensor {name!r} that {model!r} "
                              f"needs (it has {layers} layers, the model "
                              f"{model.layers})")
    plan = _plan(model)
    wanted = {name for names in plan.values() for name in names}
    missing = sorted(wanted - set(tensors.where))
    if missing:
        raise CheckpointError(f"{where}: the checkpoint has no tensor {missing[0]!r} that "
                              f"{model!r} needs ({len(missing)} missing; it has "
                              f"{len(tensors.where)} tensors)")
    extra = sorted(k for k in set(tensors.where) - wanted if not k.endswith(IGNORED))
    if extra:
        why = (" (an untied output head: load it with tied=False)" if "lm_head.weight" in extra
               else " (more layers than the model's "
               f"{model.layers})" if any(k.startswith("model.layers.") for k in extra) else "")
        raise CheckpointError(f"{tensors.file_of(extra[0])}: tensor {extra[0]!r} is not a "
                              f"parameter of {model!r}{why}; {len(extra)} such tensors")
    shapes = model.shapes()
    dts = set()
    for ours, names in plan.items():
        want = shapes[ours][1:] if ours.startswith("layers.") else shapes[ours]
        for name in names:
            shape, dt = tensors.info(name)
            if shape != tuple(want):
                raise CheckpointError(f"{tensors.file_of(name)}: tensor {name!r} has shape "
                                      f"{shape_str(shape)} but {model!r} needs "
                                      f"{shape_str(want)} there")
            dts.add(dt)
    dt = floating_dtype(dtype if dtype is not None else jnp.result_type(*dts), "load_llama")
    out = {}
    for ours, names in plan.items():
        buf = out[ours] = aligned_empty(shapes[ours], dt)
        for k, name in enumerate(names):
            np.copyto(buf[k] if ours.startswith("layers.") else buf, tensors.get(name),
                      casting="unsafe")
    return out


def from_pretrained(path, dtype=None) -> tuple[Llama, dict[str, np.ndarray]]:
    """``(model, params)`` of a Hugging Face Llama checkpoint directory (see the module)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    cfg_file = (path if path.is_dir() else path.parent) / "config.json"
    model = llama_from_config(read_config(cfg_file), str(cfg_file))
    return model, load_llama(path, model, dtype)
