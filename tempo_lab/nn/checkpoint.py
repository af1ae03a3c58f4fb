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

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ..errors import ArgumentError, CheckpointError, TempoLabError, user_api
from ..files import JSONError, read_json, user_path
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
    "attn.bq": "self_attn.q_proj.bias",     # Qwen2
    "attn.bk": "self_attn.k_proj.bias",
    "attn.bv": "self_attn.v_proj.bias",
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
    return read_object(path / "config.json" if _kind(path) == "dir" else path)


def read_object(file: Path) -> dict:
    """A checkpoint's JSON file (``config.json``, the shard index) as a dict, read through the
    package's guarded reader: damage is a ``CheckpointError`` naming the file."""
    try:
        return read_json(file, dict)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: no {file.name}; a Hugging Face checkpoint directory "
                              "holds config.json beside its safetensors files") from None
    except (OSError, JSONError) as e:
        raise CheckpointError(f"{file}: not a readable JSON file ({e})") from None


@dataclass(frozen=True)
class Rule:
    """What a numeric field of a config must be: an int (``integer``) or any finite number,
    at least ``low`` (above it when ``above``) and at most ``high``. An architecture declares
    one per field it reads (``LLAMA_FIELDS``); ``number`` checks a value against it."""

    integer: bool
    low: float
    above: bool = False
    high: float = math.inf

    def holds(self, v) -> bool:
        if isinstance(v, bool) or not isinstance(v, int if self.integer else (int, float)):
            return False
        if not self.integer:
            try:
                v = float(v)   # an int of 400 digits is no float
            except OverflowError:
                return False
            if not math.isfinite(v):
                return False
        return (v > self.low if self.above else v >= self.low) and v <= self.high

    def __str__(self) -> str:
        if self.integer:
            return f"an int in [{self.low}, {self.high}]"
        top = f" and <= {self.high:.4g}" if self.high < math.inf else ""
        return f"a finite number {'>' if self.above else '>='} {self.low}{top}"


SIZE = Rule(True, 1, high=2**31 - 1)   # token ids and extents are int32 in the program
FLOAT32_MAX = float(np.finfo(np.float32).max)   # RoPE and RMSNorm compute in float32
POSITIVE = Rule(False, 0, above=True, high=FLOAT32_MAX)
LLAMA_FIELDS = {   # every numeric field tl.nn.Llama reads, RoPE's by their name in its object
    "vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE,
    "num_attention_heads": SIZE, "num_key_value_heads": SIZE, "intermediate_size": SIZE,
    "head_dim": SIZE, "rms_norm_eps": POSITIVE, "rope_theta": Rule(False, 1, True, FLOAT32_MAX),
    "factor": POSITIVE, "low_freq_factor": POSITIVE, "high_freq_factor": POSITIVE,
    "original_max_position_embeddings": SIZE,
}


def number(fields: dict, name: str, rule: Rule, where: str, default=None, at: str = ""):
    """Field ``name`` of ``fields`` (read at ``at`` + name in the file), checked against
    ``rule`` before it is used: ``default`` when it is missing or null and there is one, else
    a ``CheckpointError`` naming the field, its value and the rule."""
    v = fields.get(name)
    if v is None and default is not None:
        return default
    if not rule.holds(v):
        what = "missing" if name not in fields else _value(v)
        raise CheckpointError(f"{where}: field {at + name!r} is {what}; give {rule}")
    return float(v) if not rule.integer else v


def _value(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def llama_from_config(cfg: dict, where: str = "config.json", **more) -> Llama:
    """The ``Llama`` a transformers ``LlamaConfig`` describes (either layout), or a
    ``CheckpointError`` naming the field it cannot honour. Every numeric field it reads is
    checked against ``LLAMA_FIELDS`` first. ``more`` are the fields of a decoder of the same
    family the config's own reader found (Qwen2's ``qkv_bias``, Mistral's ``window``), whose
    ``model_type`` that reader has checked."""
    kind = cfg.get("model_type")
    if kind not in (None, "llama") and not more:
        raise CheckpointError(f"{where}: model_type is {_value(kind)}; tl.nn.Llama reads Llama "
                              "checkpoints (model_type 'llama'); tl.nn.AutoModel.from_pretrained "
                              "reads llama, qwen2, mistral and gpt2")
    for name, fine in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"),
                       ("pretraining_tp", 1)):
        if name in cfg and cfg[name] not in (fine, None):
            raise CheckpointError(f"{where}: {name} is {_value(cfg[name])}, which tl.nn.Llama cannot "
                                  f"honour (it has {name} = {fine!r})")
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise CheckpointError(f"{where}: field 'tie_word_embeddings' is {_value(tied)}; give "
                              "true or false")

    def size(name, default=None):
        return number(cfg, name, LLAMA_FIELDS[name], where, default)

    rope, at = _rope(cfg, where)
    heads = size("num_attention_heads")
    try:
        return Llama(vocab=size("vocab_size"), embed=size("hidden_size"),
                     layers=size("num_hidden_layers"), heads=heads,
                     kv_heads=size("num_key_value_heads", heads),
                     hidden=size("intermediate_size"),
                     rope_base=number(rope, "rope_theta", LLAMA_FIELDS["rope_theta"], where,
                                      10000.0, at.get("rope_theta", "")),
                     eps=number(cfg, "rms_norm_eps", LLAMA_FIELDS["rms_norm_eps"], where, 1e-6),
                     tied=tied, head_dim=size("head_dim", 0) or None,
                     rope_scaling=_scaling(rope, at, where), **more)
    except CheckpointError:
        raise
    except TempoLabError as e:  # sizes that do not fit together (heads and widths)
        raise CheckpointError(f"{where}: {e.reason}") from None


def _rope(cfg: dict, where: str) -> tuple[dict, dict]:
    """The RoPE fields of either layout as one dict (``rope_theta``, ``rope_type``, ...), and
    the object each was read from (``{"factor": "rope_scaling."}``), for errors."""
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{where}: rope_parameters must be an object or null, got "
                              f"{_value(params)}")
    if isinstance(params, dict) and "rope_theta" not in params and params:  # per layer type
        raise CheckpointError(f"{where}: rope_parameters per layer type are not supported")
    out, at = dict(params or {}), dict.fromkeys(params or {}, "rope_parameters.")
    if "rope_theta" in cfg and "rope_theta" not in out:
        out["rope_theta"], at["rope_theta"] = cfg["rope_theta"], ""
    old = cfg.get("rope_scaling")
    if old is not None and not isinstance(old, dict):
        raise CheckpointError(f"{where}: rope_scaling must be an object or null, got "
                              f"{_value(old)}")
    out.update(old or {})
    at.update(dict.fromkeys(old or {}, "rope_scaling."))
    if "type" in out and "rope_type" not in out:  # the oldest spelling
        out["rope_type"], at["rope_type"] = out["type"], at["type"]
    return out, at


def _scaling(rope: dict, at: dict, where: str) -> RopeScaling | None:
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{where}: rope_type {_value(kind)} is not supported; tl.nn.Llama "
                              "applies 'default' and Llama 3's 'llama3' scaling")
    names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    values = [number(rope, k, LLAMA_FIELDS[k], where, at=at.get(k, at["rope_type"]))
              for k in names]
    try:
        return RopeScaling(*values)
    except TempoLabError as e:
        raise CheckpointError(f"{where}: {e.reason}") from None


# -- safetensors --------------------------------------------------------------------------------
def shard_files(path) -> list[Path]:
    """The safetensors files of a checkpoint: a file given itself, or a directory's
    ``model.safetensors`` or the shards its ``model.safetensors.index.json`` lists."""
    return _shards(Path(path))[0]


def _shards(path: Path) -> tuple[list[Path], dict[str, Path] | None]:
    """``shard_files(path)``, and the index's map of every tensor to its shard when there is
    an index (it says which shard holds a tensor; ``_Tensors`` holds the files to it)."""
    kind = _kind(path)
    if kind == "file":
        return [path], None
    if kind != "dir":
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    index = path / INDEX
    if _kind(index) == "file":
        weight_map = read_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(f, str) and f not in ("", ".", "..") and "/" not in f
                and os.sep not in f for f in weight_map.values()):
            raise CheckpointError(f"{index}: not an index of shards (a JSON object whose "
                                  "'weight_map' maps tensor names to file names)")
        where = {name: path / f for name, f in weight_map.items()}
        out = sorted(set(where.values()))
        absent = [str(f) for f in out if _kind(f) != "file"]
        if absent:
            raise CheckpointError(f"{index}: lists shards that are not there: "
                                  f"{', '.join(absent)}")
        return out, where
    if _kind(path / SINGLE) == "file":
        return [path / SINGLE], None
    raise CheckpointError(f"{path}: neither {SINGLE} nor {INDEX} is there")


def _kind(path: Path) -> str | None:
    """"file", "dir", "other" or None (not there): what ``path`` is. A path the system
    refuses (a name too long, a folder it may not read) is a ``CheckpointError``, where
    ``Path.is_file`` would raise ``OSError``."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


class _Tensors:
    """Every tensor of some safetensors files by name, opened with ``safe_open`` (headers
    read, data read on ``get``). A tensor is in one file, and in the one ``index`` names when
    there is an index: a copy elsewhere would otherwise win or lose by the order of the files."""

    def __init__(self, files: list[Path], index: dict[str, Path] | None = None):
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
                if k in self.where:
                    raise CheckpointError(f"{file}: tensor {k!r} is also in "
                                          f"{self.where[k][1]}; a checkpoint holds each tensor "
                                          "once: remove one of them")
                self.where[k] = (f, file)
        if index is not None:
            self._as_indexed(index)

    def _as_indexed(self, index: dict[str, Path]) -> None:
        """Each tensor where ``index`` says, and each tensor it lists in its shard."""
        for name, (_, file) in self.where.items():
            if index.get(name) != file:
                said = f"puts it in {index[name]}" if name in index else "does not list it"
                raise CheckpointError(f"{file}: tensor {name!r} is in this shard but {INDEX} "
                                      f"{said}; make the index name the shard that holds it")
        lost = next((n for n in index if n not in self.where), None)
        if lost is not None:
            raise CheckpointError(f"{index[lost]}: {INDEX} puts tensor {lost!r} in this shard, "
                                  "which does not hold it; make the index name the shard that "
                                  "holds it")

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


@dataclass(frozen=True)
class Names:
    """Where a model's parameters are in a checkpoint: ``layer`` is layer ``k``'s prefix as a
    format string (``"model.layers.{}."``), ``per_layer`` our ``layers.*`` entries by their name
    after it, ``single`` the others by their full name; ``ignored`` ends of names the loader
    passes over (buffers a checkpoint may hold that are recomputed)."""

    layer: str
    per_layer: dict[str, str]
    single: dict[str, str]
    ignored: tuple[str, ...] = ()

    def plan(self, model) -> dict[str, list[str]]:
        """Ours -> the checkpoint's names (one per layer for ``layers.*``)."""
        return {ours: [self.layer.format(k) + self.per_layer[ours[len("layers."):]]
                       for k in range(model.layers)] if ours.startswith("layers.")
                else [self.single[ours]] for ours in model.shapes()}

    def layers_present(self, names) -> int:
        """How many layers ``<prefix>0.*``, ``<prefix>1.*``, ... the names hold, counted up to
        the first index that has no tensor."""
        head, tail = self.layer.split("{}")
        found = {n[len(head):].split(".")[0] for n in names if n.startswith(head)}
        return next(k for k in range(len(found) + 1) if str(k) not in found)


LLAMA_NAMES = Names("model.layers.{}.", HF_NAMES, GLOBAL_NAMES, IGNORED)


@user_api
def load_llama(paths, model: Llama, dtype=None) -> dict[str, np.ndarray]:
    """``model``'s parameters from safetensors files in the Hugging Face Llama layout (one file,
    a list of shards, or a checkpoint directory), in ``dtype`` (default: the checkpoint's, the
    widest of its tensors' dtypes). Every tensor is checked against ``model`` before any is
    read: a missing, extra or misshapen tensor (another layer count, an untied head for a tied
    model) is a ``CheckpointError``."""
    if not isinstance(model, Llama):
        raise ArgumentError(f"tl.nn.load_llama: model is a {type(model).__name__}; give the "
                            "tl.nn.Llama the checkpoint is for")
    return load_weights(paths, model, LLAMA_NAMES, dtype, "tl.nn.load_llama")


def load_weights(paths, model, names, dtype, me: str) -> dict[str, np.ndarray]:
    """``load_llama`` for any model: its tensors found by ``names``, a ``Names`` or a function
    of the checkpoint's tensor names that gives one (a layout with variants)."""
    if isinstance(paths, (str, os.PathLike)):
        files, index = _shards(user_path(paths, me))
    elif isinstance(paths, (list, tuple)):
        files, index = [user_path(p, me) for p in paths], None
        for p in files:
            if _kind(p) != "file":
                raise CheckpointError(f"{p}: no such checkpoint file")
    else:
        raise ArgumentError(f"{me}: paths is a {type(paths).__name__}; give a "
                            "checkpoint directory, a safetensors file or a list of them")
    if not files:
        raise ArgumentError(f"{me}: the list of safetensors files is empty")
    tensors = _Tensors(files, index)
    where = files[0] if len(files) == 1 else files[0].parent
    names = names if isinstance(names, Names) else names(tensors.where)
    layers = names.layers_present(tensors.where)
    if model.layers > layers:  # before any name is listed: a config may say 10**12 layers
        name = names.layer.format(layers) + next(iter(names.per_layer.values()))
        raise CheckpointError(f"{where}: the checkpoint has no tensor {name!r} that {model!r} "
                              f"needs (it has {layers} layers, the model "
                              f"{model.layers})")
    plan = names.plan(model)
    wanted = {name for names in plan.values() for name in names}
    missing = sorted(wanted - set(tensors.where))
    if missing:
        why = (" (biases on q, k and v: a Qwen2 checkpoint? load it with "
               "tl.nn.AutoModel.from_pretrained)" if missing[0].endswith("_proj.bias") else "")
        raise CheckpointError(f"{where}: the checkpoint has no tensor {missing[0]!r} that "
                              f"{model!r} needs ({len(missing)} missing; it has "
                              f"{len(tensors.where)} tensors){why}")
    extra = sorted(k for k in set(tensors.where) - wanted if not k.endswith(names.ignored))
    if extra:
        prefix = names.layer.split("{}")[0]
        why = (" (an untied output head: load it with tied=False)" if "lm_head.weight" in extra
               else " (more layers than the model's "
               f"{model.layers})" if any(k.startswith(prefix) for k in extra) else "")
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
    dt = floating_dtype(dtype if dtype is not None else jnp.result_type(*dts), me)
    out = {}
    for ours, names in plan.items():
        buf = out[ours] = aligned_empty(shapes[ours], dt)
        for k, name in enumerate(names):
            np.copyto(buf[k] if ours.startswith("layers.") else buf, tensors.get(name),
                      casting="unsafe")
    return out


def from_pretrained(path, dtype=None) -> tuple[Llama, dict[str, np.ndarray]]:
    """``(model, params)`` of a Hugging Face Llama checkpoint directory (see the module)."""
    from .hub import resolve

    path = resolve(path, "tl.nn.Llama.from_pretrained")
    cfg_file = (path if _kind(path) == "dir" else path.parent) / "config.json"
    model = llama_from_config(read_config(cfg_file), str(cfg_file))
    return model, load_llama(path, model, dtype)
