"""Decoding benchmark: a decoder written once in tempo_lab and twice in plain JAX.

    python -m benchmarks.decode [--quick] [--model gpt2|llama] [--preset llama-3.2-1b]
        [--dtype float32|bfloat16] [--layers 2] [--heads 4] [--kv-heads H] [--head-dim D]
        [--rope-scaling F LOW HIGH CTX] [--vocab V] [--embed 256] [--batch 4] [--seq-len 256 1024]
        [--attention causal|window|both] [--window 64] [--runs 5] [--tl-runs N]
        [--systems ...] [--kv-layout bhtd|bthd] [--out benchmarks/results/decode.json]
        [--no-progress]

Models (``--model``, recorded as ``model``):

- ``gpt2`` (default): the demo's GPT-2-style block (RMSNorm without scale, multi-head
  attention, a ReLU MLP of width 2 x embed) on given token embeddings; output: the last layer's
  hidden state at every step; checked against a NumPy decoder.
- ``llama``: ``tl.nn.Llama`` (grouped-query attention with ``--kv-heads`` (default heads / 2),
  RoPE, SwiGLU of width 3 x embed, a tied head over ``--vocab`` tokens) decoding greedily
  from a 16-token prompt, each step fed the token the last one picked; output: the tokens;
  checked as a greedy decode by the plain-JAX twin (see ``benchmarks.llama``); no system can
  run a layer over all steps at once, as in serving.

Systems (same weights, same tokens, outputs checked against the model's check after the timed
runs):

- ``tempo_lab``: the decoder with batch, layer and step as dims ``(b, n, t)``; attention reads
  keys/values over ``0:t+1`` (causal) or ``max(0, t-W+1):t+1`` (window).
- ``jax_scan``: one ``jax.jit`` of a ``lax.scan`` over t with a preallocated KV cache per layer,
  ``(batch, heads, T, dh)`` (``--kv-layout bthd``: ``(batch, T, heads, dh)``);
  attention over the whole cache under a causal (or causal+window) mask.
- ``jax_step``: the same step jitted alone and called from a Python loop, the cache donated.

Each (system, configuration) runs in a fresh subprocess (``--one SYSTEM``) so that the process
peak RSS is that system's own; the subprocess prints one JSON record on stdout.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# jax and tempo_lab are imported inside the functions that use them: the parent process only
# spawns the runs and prints the table, and stays small, because a child process starts with
# its parent's peak RSS as its own ru_maxrss (Linux keeps it across fork and exec).

SYSTEMS = ("tempo_lab", "jax_scan", "jax_step", "hf_generate")
JAX_SYSTEMS = SYSTEMS[:3]  # hf_generate: llama only, where transformers is installed
PRESETS = {  # real models' sizes (their config.json), as defaults of the flags
    "llama-3.2-1b": {"model": "llama", "vocab": 128256, "embed": 2048, "layers": 16,
                     "heads": 32, "kv_heads": 8, "hidden": 8192, "head_dim": 64,
                     "rope_scaling": [32.0, 1.0, 4.0, 8192], "batch": 1, "seq_len": [64],
                     "attention": "causal", "runs": 3},
}
RESULT_PREFIX = "DECODE_RESULT "
RTOL = ATOL = 1e-3
BF16_ATOL = 0.25  # logits: a few bfloat16 roundings of values near 10
MODELS = ("gpt2", "llama")
DEFAULT_OUT = os.path.join("benchmarks", "results", "decode.json")
QUICK_OUT = os.path.join("benchmarks", "results", "decode_quick.json")
F32 = 4  # bytes


@dataclass(frozen=True)
class Config:
    layers: int
    heads: int
    embed: int
    batch: int
    seq_len: int
    attention: str          # "causal" | "window"
    window: int | None      # W for "window", None for "causal"
    model: str = "gpt2"     # one of MODELS
    kv_heads: int | None = None     # llama: key/value heads (None: heads // 2, at least 1)
    vocab: int = 4096       # llama: the vocabulary (the tied head's width)
    ffn: int | None = None  # the MLP's width (None: 3 x embed for llama, 2 x embed for gpt2)
    head_dim: int | None = None     # llama (None: embed // heads)
    rope_scaling: tuple | None = None   # llama: Llama 3's (factor, low, high, original context)
    dtype: str = "float32"  # llama: the weights' dtype (bfloat16: kept so by every system)

    @property
    def hidden(self) -> int:
        return self.ffn or (3 if self.model == "llama" else 2) * self.embed

    @property
    def llama(self):
        """The ``tl.nn.Llama`` of a llama configuration."""
        import tempo_lab as tl

        kv = self.kv_heads or max(1, self.heads // 2)
        scaling = None if not self.rope_scaling else tl.nn.RopeScaling(
            *map(float, self.rope_scaling[:3]), int(self.rope_scaling[3]))
        return tl.nn.Llama(self.vocab, self.embed, self.layers, self.heads, kv, self.hidden,
                           window=self.window, head_dim=self.head_dim, rope_scaling=scaling)

    @property
    def dh(self) -> int:
        return self.head_dim or self.embed // self.heads

    def label(self) -> str:
        att = "causal" if self.window is None else f"window {self.window}"
        return f"{self.model} {att}, T={self.seq_len}"


# -- inputs and the check -----------------------------------------------------------------------
def make_inputs(cfg: Config) -> tuple[dict, np.ndarray]:
    """gpt2: the weights of ``tempo_lab.demo`` and token embeddings (b, t, embed); llama:
    ``Llama.init(0, dtype)`` (aligned arrays, which JAX uses in place) and token ids (b, t)."""
    if cfg.model == "llama":
        return cfg.llama.init(0, cfg.dtype), make_tokens(cfg)
    from tempo_lab.demo import make_weights

    weights = make_weights(cfg.layers, cfg.embed, cfg.hidden, seed=0)
    tokens = np.random.default_rng(1).standard_normal(
        (cfg.batch, cfg.seq_len, cfg.embed)).astype(np.float32)
    return weights, tokens


def make_tokens(cfg: Config) -> np.ndarray:
    """llama: the token ids (b, t) whose first ``llama.PROMPT`` are the prompt."""
    ids = np.random.default_rng(1).integers(0, cfg.vocab, (cfg.batch, cfg.seq_len))
    return ids.astype(np.int32)


def reference(cfg: Config, weights: dict, tokens: np.ndarray) -> np.ndarray:
    """What ``check_output`` compares with: the NumPy decoder's output (gpt2), or the prompt
    that a greedy decode must start with (llama)."""
    if cfg.model == "llama":
        from benchmarks import llama

        return llama.prompt_of(tokens)
    return numpy_reference(weights, tokens, cfg.heads, cfg.window)


def numpy_reference(weights: dict, tokens: np.ndarray, heads: int,
                    window: int | None = None) -> np.ndarray:
    """``tempo_lab.demo.numpy_decoder`` (batched, optional window)."""
    from tempo_lab.demo import numpy_decoder

    return numpy_decoder(weights, tokens, heads, window)


def check_output(system: str, cfg: Config, got: np.ndarray, want: np.ndarray,
                 weights: dict | None = None) -> float:
    """Abort (SystemExit 2) unless ``got`` matches ``reference`` (gpt2: max |got - want|
    returned) or is a greedy decode of the prompt ``want`` by ``weights`` (llama: the largest
    logit shortfall returned)."""
    if cfg.model == "llama":
        from benchmarks import llama

        try:
            gap = llama.check(cfg.llama, weights, want, got)
        except ValueError as e:
            sys.exit(f"MISMATCH {system} ({cfg.label()}): {e}")
        # transformers computes a bfloat16 model in bfloat16 (the others accumulate in
        # float32): its greedy pick may miss the float32 maximum by bfloat16's rounding
        tol = BF16_ATOL if system == "hf_generate" and cfg.dtype == "bfloat16" else ATOL
        if gap > tol:
            sys.exit(f"MISMATCH {system} ({cfg.label()}): a token's logit is {gap:.3e} below "
                     f"the step's largest (tolerance {tol}); not timing it")
        return gap
    if got.shape != want.shape:
        sys.exit(f"MISMATCH {system} ({cfg.label()}): output shape {got.shape}, "
                 f"expected {want.shape}")
    err = float(np.max(np.abs(got - want)))
    if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
        sys.exit(f"MISMATCH {system} ({cfg.label()}): max |{system} - reference| = {err:.3e} "
                 f"(rtol={RTOL}, atol={ATOL}); not timing it")
    return err


# -- tempo_lab ---------------------------------------------------------------------------------
def tempo_lab_decoder(ctx, weights: dict, tokens: np.ndarray, heads: int,
                      window: int | None = None):
    """``tempo_lab.demo.decoder`` with batch as a dim: ``ctx`` has dims ``(b, n, t)``; tokens
    over ``(b, t)``, weights over ``(n,)``. Returns the last layer's output ``h_out[b, N-1, t]``.
    """
    from tempo_lab.demo import decoder

    b, n, t = ctx.dims
    N = ctx.bounds[1]
    h_out = decoder(ctx, weights, tokens, heads, window)
    with ctx:
        return h_out[b, N - 1, t]


class _CompileClock:
    """Sums JAX's own compile-duration events (trace, lowering, XLA compile) while active."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        import jax.monitoring

        self.seconds = 0.0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, name, secs, **_):
        if self.active and name in self.EVENTS:
            self.seconds += secs


def compile_tempo_lab(cfg: Config, weights: dict, tokens: np.ndarray,
                      block_size: int | None = None, tile_block: int | None = None):
    """The decoder compiled for ``cfg`` (output ``"y"``): a ``Program`` whose stages
    (``prog.memory.timeline``, ...) a notebook can look at; ``block_size`` sets
    ``CompileConfig.block_size``, ``tile_block`` its ``tile_block`` (0: tiling off; None:
    the defaults)."""
    import tempo_lab as tl

    ctx = tl.Context(dims=("b", "n", "t"))
    B, N, T = ctx.bounds
    if cfg.model == "llama":
        from benchmarks import llama

        y = llama.tempo_lab_program(ctx, cfg.llama, weights, tokens)
    else:
        y = tempo_lab_decoder(ctx, weights, tokens, cfg.heads, cfg.window)
    kw = {} if block_size is None else {"block_size": block_size}
    if tile_block == 0:
        kw["tile"] = False
    elif tile_block is not None:
        kw["tile_block"] = tile_block
    config = tl.CompileConfig(**kw)
    return ctx.compile(bounds={B: cfg.batch, N: cfg.layers, T: cfg.seq_len}, outputs={"y": y},
                       config=config)


def bench_tempo_lab(cfg: Config, weights, tokens, ref, warm_runs: int, progress: bool,
                    block_size: int | None = None, tile_block: int | None = None) -> dict:
    clock = _CompileClock()
    t0 = time.perf_counter()
    prog = compile_tempo_lab(cfg, weights, tokens, block_size, tile_block)
    # trace: the model's Python building the program (the rest of the call is compile_times)
    stages = {"trace": time.perf_counter() - t0 - sum(prog.compile_times.values()),
              **prog.compile_times}

    clock.active = True
    first = prog.run()
    clock.active = False
    runs = [first]
    bar = _bar(warm_runs, f"tempo_lab {cfg.label()}: warm runs", progress)
    for _ in range(warm_runs):
        runs.append(prog.run())
        bar.update()
    bar.close()
    warm = [r.seconds for r in runs[1:]]
    if warm:
        kernels = max(0.0, first.seconds - statistics.median(warm))
        method = ("sum(prog.compile_times) + (first run - median warm run): the first run "
                  "jits the kernels")
        timing = f"median of {len(warm)} warm runs"
    else:
        # --tl-runs 0: the one (cold) run is timed and the compile time JAX reports during it
        # (its compile-duration events) is taken out.
        kernels = clock.seconds
        warm = [first.seconds - clock.seconds]
        method = ("sum(prog.compile_times) + JAX compile events (trace, lowering, XLA compile) "
                  "during the first run [no warm run]")
        timing = "the first (cold) run minus JAX compile events [no warm run]"
    stages["kernels"] = kernels
    last = runs[-1]
    return {
        **_time_fields(warm, cfg.seq_len),
        "warm_runs": len(runs) - 1,
        "timing": timing,
        "compile_s": sum(stages.values()),
        "compile_s_by_stage": stages,
        "compile_method": method,
        "kernel_compile_s_events": clock.seconds,
        "first_run_s": first.seconds,
        "executor": prog.executor,
        "block_size": prog.config.block_size,
        "tile_block": (prog.config.tile_block or "auto") if prog.config.tile else 0,
        "tile_blocks": prog.bounds.get("T_TILE", 0),
        "store_peak_bytes": int(last.profile.peak_bytes),
        "predicted_store_peak_bytes": int(prog.memory.peak_bytes),
        "kernel_calls": int(sum(last.profile.calls.values())),
        "_output": first["y"],
    }


# -- plain JAX baselines ------------------------------------------------------------------------
KV_LAYOUTS = {
    # one cache per layer, its axes: heads before T keeps each head's keys contiguous, so the
    # attention contractions read the cache in place; with T before heads XLA transposes the
    # whole layer cache at every step (about 2x slower at T=1024 here)
    "bhtd": "(batch, heads, T, dh) per layer",
    "bthd": "(batch, T, heads, dh) per layer",
}


def _jax_layer(h, kc, vc, t, w: dict, heads: int, window: int | None, layout: str):
    """One pre-norm block for one step at every batch entry. h: (B, D); kc, vc: the layer's
    KV cache (see KV_LAYOUTS), written at step t; w: the layer's weights (arrays of their
    own: a layer sliced out of stacked weights is a copy XLA makes at every step); attention
    masked over the whole cache."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    batch, d = h.shape
    dh = d // heads
    steps = kc.shape[2 if layout == "bhtd" else 1]

    def norm(x):
        return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    x = norm(h)
    q = (x @ w["wq"]).reshape(batch, heads, dh)
    k = (x @ w["wk"]).reshape(batch, heads, dh)
    v = (x @ w["wv"]).reshape(batch, heads, dh)
    if layout == "bhtd":
        kc = lax.dynamic_update_slice(kc, k[:, :, None], (0, 0, t, 0))
        vc = lax.dynamic_update_slice(vc, v[:, :, None], (0, 0, t, 0))
        spec = "bhsd"
    else:
        kc = lax.dynamic_update_slice(kc, k[:, None], (0, t, 0, 0))
        vc = lax.dynamic_update_slice(vc, v[:, None], (0, t, 0, 0))
        spec = "bshd"
    s = jnp.einsum(f"bhd,{spec}->bhs", q, kc) / float(np.sqrt(dh))   # (B, heads, T)
    pos = jnp.arange(steps)
    mask = pos <= t
    if window is not None:
        mask &= pos > t - window
    p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
    att = jnp.einsum(f"bhs,{spec}->bhd", p, vc).reshape(batch, d)
    h_mid = h + att @ w["wo"]
    return h_mid + jax.nn.relu(norm(h_mid) @ w["w1"]) @ w["w2"], kc, vc


def _cache_shape(cfg: Config, layout: str) -> tuple[int, ...]:
    """One layer's key (or value) cache."""
    kv = cfg.llama.kv_heads if cfg.model == "llama" else cfg.heads
    if layout == "bhtd":
        return (cfg.batch, kv, cfg.seq_len, cfg.dh)
    return (cfg.batch, cfg.seq_len, kv, cfg.dh)


def _empty_caches(cfg: Config, layout: str) -> tuple:
    import jax.numpy as jnp

    shape = _cache_shape(cfg, layout)
    return tuple((jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))
                 for _ in range(cfg.layers))


def _gpt2_weights(weights: dict, layers: int) -> list[dict]:
    """The demo's stacked weights as one dict of device arrays per layer (views of the
    user's arrays, in place where JAX allows it)."""
    import jax

    return [{k: jax.device_put(v[j]) for k, v in weights.items()} for j in range(layers)]


def _jax_step_fn(cfg: Config, layout: str):
    """``step(caches, h_t, t, w) -> (h, caches)``: one gpt2 decode step of every batch entry
    in plain JAX, ``h_t`` the step's token embeddings, ``w`` the weights per layer."""

    def step(caches, h, t, w):
        out = []
        for (kc, vc), wl in zip(caches, w):
            h, kc, vc = _jax_layer(h, kc, vc, t, wl, cfg.heads, cfg.window, layout)
            out.append((kc, vc))
        return h, tuple(out)
    return step


def jax_store_bytes(cfg: Config) -> dict:
    """What the JAX baselines allocate, from array sizes: the KV caches (keys and values), the
    outputs and one layer's activations of one step (x, q, k, v, attention, h_mid, its norm, h:
    8 x (B, D); the MLP's hidden values: 2 (gpt2) or 3 (llama) x (B, hidden); scores and
    probabilities: 2 x (B, heads, T); llama's logits and their exponentials: 2 x (B, vocab);
    the mask: T bools). Weights and tokens (inputs) are not counted."""
    llama = cfg.model == "llama"
    kv = 2 * F32 * cfg.layers * int(np.prod(_cache_shape(cfg, "bhtd")))
    out = cfg.batch * cfg.seq_len * (1 if llama else cfg.embed) * F32
    act = (F32 * (8 * cfg.batch * cfg.embed + (3 if llama else 2) * cfg.batch * cfg.hidden
                  + 2 * cfg.batch * cfg.heads * cfg.seq_len
                  + (2 * cfg.batch * cfg.vocab if llama else 0)) + cfg.seq_len)
    return {"kv_cache_bytes": kv, "output_bytes": out, "activation_bytes": act,
            "store_peak_bytes": kv + out + act}


def _xla_memory(compiled) -> dict | None:
    """XLA's own buffer sizes for the compiled program (for reference; not the table's)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None
    if m is None:
        return None
    return {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                             "alias_size_in_bytes", "temp_size_in_bytes")
            if hasattr(m, k)}


def _jax_record(cfg, kv_layout, compiled, compile_s, method, first_s, out, warm) -> dict:
    return {**_time_fields(warm, cfg.seq_len), "warm_runs": len(warm),
            "timing": f"median of {len(warm)} warm runs", "compile_s": compile_s,
            "compile_method": method, "first_run_s": first_s, "kv_layout": KV_LAYOUTS[kv_layout],
            **jax_store_bytes(cfg), "xla_memory": _xla_memory(compiled), "_output": out}


def _llama_layout(kv_layout: str) -> None:
    if kv_layout != "bhtd":
        sys.exit("--kv-layout bthd is for --model gpt2; the llama twin keeps (batch, "
                 "kv_heads, T, head_dim) per layer")


def bench_jax_scan(cfg: Config, weights, tokens, ref, warm_runs: int, progress: bool,
                   kv_layout: str = "bhtd") -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    if cfg.model == "llama":
        from benchmarks import llama

        _llama_layout(kv_layout)
        decode, given = llama.scan_decode(cfg.llama, cfg.seq_len), jnp.asarray(ref)   # prompt
        w = llama.device_params(weights, cfg.llama)
    else:
        step, given = _jax_step_fn(cfg, kv_layout), jnp.asarray(tokens)
        w = _gpt2_weights(weights, cfg.layers)

        def decode(tokens, w):
            def body(caches, xs):
                x, t = xs
                _, w_t = lax.optimization_barrier((t, w))  # nothing of w hoisted and held
                y, caches = step(caches, x, t, w_t)
                return caches, y

            xs = (jnp.swapaxes(tokens, 0, 1), jnp.arange(cfg.seq_len, dtype=jnp.int32))
            _, hs = lax.scan(body, _empty_caches(cfg, kv_layout), xs)    # (T, B, D)
            return jnp.swapaxes(hs, 0, 1)

    t0 = time.perf_counter()
    compiled = jax.jit(decode).lower(given, w).compile()
    compile_s = time.perf_counter() - t0

    def run():
        t0 = time.perf_counter()
        out = np.asarray(compiled(given, w))
        return out, time.perf_counter() - t0

    out, first_s = run()
    warm = _warm(run, warm_runs, f"jax_scan {cfg.label()}: warm runs", progress)
    return _jax_record(cfg, kv_layout, compiled, compile_s, "jax.jit(...).lower(...).compile()",
                       first_s, out, warm)


def bench_jax_step(cfg: Config, weights, tokens, ref, warm_runs: int, progress: bool,
                   kv_layout: str = "bhtd") -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    caches = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          _empty_caches(cfg, kv_layout))
    if cfg.model == "llama":
        from benchmarks import llama

        _llama_layout(kv_layout)
        prompt, w = jnp.asarray(ref), llama.device_params(weights, cfg.llama)
        t0 = time.perf_counter()
        compiled = jax.jit(llama.jitted_step(cfg.llama), donate_argnums=(0,)).lower(
            caches, prompt[:, 0], prompt, np.int32(0), w).compile()

        def decode(caches):
            tok, out = prompt[:, 0], []
            for t in range(cfg.seq_len):
                out.append(tok)
                caches, tok = compiled(caches, tok, prompt, np.int32(t), w)  # caches donated
            return out
    else:
        one, tok = _jax_step_fn(cfg, kv_layout), jnp.asarray(tokens)
        w = _gpt2_weights(weights, cfg.layers)

        def step(caches, tokens, t, w):
            y, caches = one(caches, lax.dynamic_index_in_dim(tokens, t, axis=1,
                                                             keepdims=False), t, w)
            return caches, y

        t0 = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=(0,)).lower(
            caches, tok, np.int32(0), w).compile()

        def decode(caches):
            out = []
            for t in range(cfg.seq_len):
                caches, h = compiled(caches, tok, np.int32(t), w)   # caches donated
                out.append(h)
            return out
    compile_s = time.perf_counter() - t0

    def run():
        t0 = time.perf_counter()
        out = np.asarray(jnp.stack(decode(_empty_caches(cfg, kv_layout)), axis=1))
        return out, time.perf_counter() - t0

    out, first_s = run()
    warm = _warm(run, warm_runs, f"jax_step {cfg.label()}: warm runs", progress)
    return _jax_record(cfg, kv_layout, compiled, compile_s,
                       "jax.jit(step, donate_argnums=(0,)).lower(...).compile()",
                       first_s, out, warm)


def bench_hf_generate(cfg: Config, weights, tokens, ref, warm_runs: int, progress: bool,
                      kv_layout: str = "bhtd") -> dict:
    """``transformers``' ``LlamaForCausalLM.generate`` (greedy, its own KV cache) on the CPU
    with PyTorch, holding the same arrays (``torch.from_numpy``: no copy); llama only, and
    only where transformers and torch are installed (the ``bench`` extra)."""
    from benchmarks import hf

    if cfg.model != "llama":
        sys.exit("hf_generate is a reference for --model llama")
    model = cfg.llama
    t0 = time.perf_counter()
    generate = hf.greedy(model, weights)
    compile_s = time.perf_counter() - t0
    prompt = np.asarray(ref)

    def run():
        t0 = time.perf_counter()
        out = generate(prompt, cfg.seq_len)
        return out, time.perf_counter() - t0

    out, first_s = run()
    warm = _warm(run, warm_runs, f"hf_generate {cfg.label()}: warm runs", progress)
    return {**_time_fields(warm, cfg.seq_len), "warm_runs": len(warm),
            "timing": f"median of {len(warm)} warm runs", "compile_s": compile_s,
            "compile_method": "building LlamaForCausalLM around the arrays (no compilation)",
            "first_run_s": first_s, "store_peak_bytes": None, "_output": out}


BENCH = {"tempo_lab": bench_tempo_lab, "jax_scan": bench_jax_scan, "jax_step": bench_jax_step,
         "hf_generate": bench_hf_generate}


# -- helpers ------------------------------------------------------------------------------------
def _bar(total: int, desc: str, progress: bool, position: int = 1):
    if not progress or total == 0:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, position=position, leave=False)


class _NoBar:
    def update(self, n: int = 1):
        pass

    def close(self):
        pass

    def set_description(self, desc: str):
        pass


def _warm(run, n: int, desc: str, progress: bool) -> list[float]:
    bar = _bar(n, desc, progress)
    secs = []
    for _ in range(n):
        secs.append(run()[1])
        bar.update()
    bar.close()
    return secs


def _time_fields(seconds: list[float], steps: int) -> dict:
    ms = [1e3 * s / steps for s in seconds]
    return {"ms_per_token": statistics.median(ms), "ms_per_token_min": min(ms),
            "ms_per_token_max": max(ms)}


def taking_turns(measures: dict, rounds: int, on_round=None) -> dict[str, list]:
    """Each of ``measures`` (name -> a function that runs its system once and returns what it
    measured) called once per round for ``rounds`` rounds, in the order A B C, then C B A: on
    a shared machine a system's time drifts by half between runs seconds apart; taking turns,
    a slow moment slows every system of its round, so the rounds' ratios stay true."""
    got: dict[str, list] = {name: [] for name in measures}
    names = list(measures)
    for k in range(rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            got[name].append(measures[name]())
        if on_round is not None:
            on_round()
    return got


def loadavg() -> list[float] | None:
    """The machine's 1-, 5- and 15-minute load averages: the machine is shared, so a record
    says how busy it was while the record was timed."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def rss_peak_bytes() -> int:
    """The process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS). Process-wide
    and monotone; on Linux a child also starts from its parent's peak at fork."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def vm_hwm_bytes() -> int | None:
    """The peak resident set of this process's own address space (Linux VmHWM; it starts
    afresh at exec), as a cross-check of ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def environment() -> dict:
    import jax

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "tempo_lab"],
                                    cwd=root, text=True, capture_output=True).stdout.strip())
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "jax_device": str(jax.devices()[0].device_kind),
            "tempo_lab_commit": commit}


def configs(args) -> list[Config]:
    atts = ("causal", "window") if args.attention == "both" else (args.attention,)
    scaling = tuple(args.rope_scaling) if args.rope_scaling else None
    return [Config(args.layers, args.heads, args.embed, args.batch, T, a,
                   args.window if a == "window" else None, args.model, args.kv_heads,
                   args.vocab, args.hidden, args.head_dim, scaling, args.dtype)
            for T in args.seq_len for a in atts]


# -- child processes -----------------------------------------------------------------------------
def prepare(args) -> int:
    """``--prepare FILE``: write the inputs and the NumPy reference of one configuration."""
    (cfg,) = configs(args)
    if cfg.model == "llama":  # each child draws the same weights itself (aligned, no file)
        weights, tokens = {}, make_tokens(cfg)
    else:
        weights, tokens = make_inputs(cfg)
    ref = reference(cfg, weights, tokens)
    np.savez(args.prepare, tokens=tokens, reference=ref,
             **{f"w_{k}": v for k, v in weights.items()})
    return 0


def run_one(args) -> int:
    """``--one SYSTEM``: check and time one system on one configuration in this process and
    print its record (one JSON line after RESULT_PREFIX)."""
    import tempo_lab as tl

    load_start = loadavg()
    if args.no_progress:
        tl.config.progress = False
    progress = tl.config.progress
    (cfg,) = configs(args)
    if args.inputs:
        with np.load(args.inputs) as f:
            weights = {k[2:]: f[k] for k in f.files if k.startswith("w_")}
            tokens = f["tokens"]
            ref = f["reference"]
        if cfg.model == "llama":
            weights = cfg.llama.init(0, cfg.dtype)
    else:    # standalone (a reproducer): the NumPy reference then counts in this RSS
        weights, tokens = make_inputs(cfg)
        ref = reference(cfg, weights, tokens)
    if args.one == "tempo_lab":
        warm = args.runs if args.tl_runs is None else args.tl_runs
        rec = bench_tempo_lab(cfg, weights, tokens, ref, warm, progress, args.block_size,
                              args.tile_block)
    else:
        rec = BENCH[args.one](cfg, weights, tokens, ref, args.runs, progress, args.kv_layout)
    out = rec.pop("_output")
    # the peak of the timed runs, read before the check (its forward pass holds more)
    rss, hwm = rss_peak_bytes(), vm_hwm_bytes()
    rec["max_abs_err"] = check_output(args.one, cfg, out, ref, weights)
    if args.save_output:
        np.save(args.save_output, out)
    rec = {"system": args.one, **asdict(cfg), "hidden": cfg.hidden, **rec,
           "rss_peak_bytes": rss, "vm_hwm_bytes": hwm,
           "loadavg_1m_at_start": load_start and load_start[0], "loadavg_at_start": load_start,
           "loadavg_at_end": loadavg(), **environment()}
    print(RESULT_PREFIX + json.dumps(rec), flush=True)
    return 0


def _child_args(cfg: Config, args) -> list[str]:
    return (["--model", cfg.model, "--layers", str(cfg.layers), "--heads", str(cfg.heads),
             "--embed", str(cfg.embed), "--batch", str(cfg.batch), "--seq-len", str(cfg.seq_len),
             "--attention", cfg.attention, "--window", str(args.window), "--vocab",
             str(cfg.vocab), "--dtype", cfg.dtype]
            + ([] if cfg.kv_heads is None else ["--kv-heads", str(cfg.kv_heads)])
            + ([] if cfg.ffn is None else ["--hidden", str(cfg.ffn)])
            + ([] if cfg.head_dim is None else ["--head-dim", str(cfg.head_dim)])
            + ([] if cfg.rope_scaling is None else
               ["--rope-scaling", *map(str, cfg.rope_scaling)]))


def _child_cmd(system: str, cfg: Config, args) -> list[str]:
    """``python -m benchmarks.decode --one SYSTEM ...`` for one configuration (it builds its
    own inputs and NumPy reference when not given ``--inputs``)."""
    cmd = [sys.executable, "-m", "benchmarks.decode", "--one", system, *_child_args(cfg, args),
           "--runs", str(args.runs), "--kv-layout", args.kv_layout]
    if args.tl_runs is not None:
        cmd += ["--tl-runs", str(args.tl_runs)]
    if args.block_size is not None:
        cmd += ["--block-size", str(args.block_size)]
    if args.tile_block is not None:
        cmd += ["--tile-block", str(args.tile_block)]
    if not args.progress:
        cmd.append("--no-progress")
    return cmd


# -- the table ------------------------------------------------------------------------------
def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def _ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "-"
    r = a / b
    return f"{r:.0f}x" if r >= 100 else f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def _load(r: dict) -> str:
    """The 1-minute load average when the record's subprocess started and ended."""
    a, b = r.get("loadavg_at_start"), r.get("loadavg_at_end")
    return "-" if not a or not b else f"{a[0]:.1f}-{b[0]:.1f}"


def table(records: list[dict]) -> str:
    head = (f"{'model':<5} {'attention':<10} {'T':>5}  {'system':<9}  {'ms/token median [min, max]':<30} "
            f"{'compile s':>9}  {'store peak MiB':>14}  {'predicted':>9}  {'rss MiB':>7}  runs"
            f"  load 1m")
    lines = [head, "-" * len(head)]
    keyed = {}
    for r in records:
        key = (r.get("model", "gpt2"), r["seq_len"], r["attention"], r["window"],
               r.get("dtype", "float32"))
        keyed.setdefault(key, {})[r["system"]] = r
    for (model, T, att, win, dtype), by in keyed.items():
        name = (att if win is None else f"window {win}") + ("" if dtype == "float32" else
                                                            " bf16")
        for s in SYSTEMS:
            r = by.get(s)
            if r is None:
                continue
            ms = (f"{r['ms_per_token']:.3f} [{r['ms_per_token_min']:.3f}, "
                  f"{r['ms_per_token_max']:.3f}]")
            lines.append(f"{model:<5} {name:<10} {T:>5}  {s:<9}  {ms:<30} {r['compile_s']:>9.2f}  "
                         f"{_mb(r['store_peak_bytes']):>14}  "
                         f"{_mb(r.get('predicted_store_peak_bytes')):>9}  "
                         f"{_mb(r['rss_peak_bytes']):>7}  {r['warm_runs']:>4}  {_load(r)}")
        a = by.get("tempo_lab")
        for base in ("jax_scan", "jax_step", "hf_generate"):
            b = by.get(base)
            if a and b:
                lines.append(
                    f"{'':<5} {'':<10} {'':>5}  {'ratio':<9}  tempo_lab / {base}: ms/token "
                    f"{_ratio(a['ms_per_token'], b['ms_per_token'])}, compile "
                    f"{_ratio(a['compile_s'], b['compile_s'])}, store peak "
                    f"{_ratio(a['store_peak_bytes'], b['store_peak_bytes'])}, rss "
                    f"{_ratio(a['rss_peak_bytes'], b['rss_peak_bytes'])}")
    return "\n".join(lines)


NOTES = """\
ms/token: run wall time / T (median [min, max] over the warm runs; 'runs' = warm runs).
compile s: tempo_lab = sum(prog.compile_times) (build, validate, passes, schedule, memory) +
  kernel compilation, taken as the first run's time minus the median warm run (kernels are
  jitted lazily on the first run; with no warm run: the compile time JAX reports during the
  first run); JAX = jax.jit(...).lower(...).compile().
store peak: tempo_lab = run.profile.peak_bytes (measured bytes of tensor stores), 'predicted' =
  prog.memory.peak_bytes; JAX = KV cache + outputs + one layer's step activations, from array
  sizes (weights and tokens not counted).
rss: peak resident set of the subprocess that ran that system alone (ru_maxrss).
load 1m: the machine's 1-minute load average when that subprocess started and ended (the
  machine is shared: a load above the CPU count means the times are inflated)."""


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decode",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=tuple(PRESETS), default=None,
                    help="a real model's sizes (llama-3.2-1b: its 16 layers, random weights; "
                         "--layers, --dtype and the other flags given override it)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="llama: the weights' dtype (activations accumulate in float32)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="the MLP's width (default 3 x embed for llama, 2 x embed for gpt2)")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="llama: the size of a head (default embed // heads)")
    ap.add_argument("--rope-scaling", type=float, nargs=4, default=None,
                    metavar=("FACTOR", "LOW", "HIGH", "CONTEXT"),
                    help="llama: Llama 3's RoPE scaling (factor, low and high frequency "
                         "factors, original context)")
    ap.add_argument("--model", choices=MODELS, default="gpt2")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="llama: key/value heads (default heads // 2)")
    ap.add_argument("--vocab", type=int, default=4096, help="llama: vocabulary size")
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--attention", choices=("causal", "window", "both"), default="both")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--runs", type=int, default=None,
                    help="warm runs per system (default 5; --quick: 3)")
    ap.add_argument("--tl-runs", type=int, default=None,
                    help="warm runs for tempo_lab only (default: --runs; --quick: 1; 0 times "
                         "the cold run minus JAX's compile events)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None,
                    help="default: tempo_lab, jax_scan, jax_step, and for llama hf_generate "
                         "where transformers and torch are installed")
    ap.add_argument("--block-size", type=int, default=None,
                    help="tempo_lab's CompileConfig.block_size (points per block of a growing "
                         "store; default: CompileConfig's)")
    ap.add_argument("--tile-block", type=int, default=None,
                    help="tempo_lab's CompileConfig.tile_block (points per block of a tiled "
                         "0:t+1 range; 0: tiling off; default: automatic)")
    ap.add_argument("--kv-layout", choices=tuple(KV_LAYOUTS), default="bhtd",
                    help="the JAX baselines' KV cache: bhtd = (layers, batch, heads, T, dh) "
                         "(default), bthd = (layers, batch, T, heads, dh)")
    ap.add_argument("--quick", action="store_true",
                    help="2 layers, embed 256, 4 heads, batch 4, T=1024, causal and window 64 "
                         "in under 3 minutes: 1 warm run for tempo_lab, 3 for JAX (see README)")
    ap.add_argument("--out", default=None,
                    help=f"JSON file (default {DEFAULT_OUT}, with --quick {QUICK_OUT})")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--save-output", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", help=argparse.SUPPRESS)
    known, _ = ap.parse_known_args(argv)
    if known.preset:
        ap.set_defaults(**PRESETS[known.preset])
    args = ap.parse_args(argv)
    if args.systems is None:
        args.systems = [s for s in SYSTEMS if s != "hf_generate" or (
            args.model == "llama" and all(importlib.util.find_spec(m) is not None
                                          for m in ("transformers", "torch")))]
    if args.quick:
        args.layers, args.embed, args.heads, args.batch = 2, 256, 4, 4
        args.seq_len, args.attention, args.window = [1024], "both", 64
        if args.tl_runs is None:
            args.tl_runs = 1
        if args.runs is None:
            args.runs = 3
    if args.runs is None:
        args.runs = 5
    if args.embed % args.heads and not args.preset:
        ap.error("--embed must be a multiple of --heads")
    if args.kv_heads is not None and (args.kv_heads < 1 or args.heads % args.kv_heads):
        ap.error("--kv-heads must divide --heads")
    if (args.one or args.prepare) and len(configs(args)) != 1:
        ap.error("--one/--prepare take one configuration: one --seq-len and --attention causal|window")
    if min(args.runs, args.tl_runs if args.tl_runs is not None else args.runs) < 0:
        ap.error("--runs/--tl-runs must be >= 0")
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    return args


def _run_notes(args) -> list[str]:
    notes = []
    tl_runs = args.runs if args.tl_runs is None else args.tl_runs
    if "tempo_lab" in args.systems and tl_runs < 5:
        notes.append(f"tempo_lab ran {tl_runs} warm run(s), not 5"
                     + (" (--quick)" if args.quick else "")
                     + (": its time per token is its one (cold) run minus the compile time "
                        "JAX reports (trace, lowering, XLA compile events), and that compile "
                        "time is its kernel compile time" if tl_runs == 0 else ""))
    if args.runs < 5:
        notes.append(f"the JAX baselines ran {args.runs} warm runs, not 5"
                     + (" (--quick)" if args.quick else ""))
    return notes


def _write(records: list[dict], path: str) -> None:
    """The records as JSON; main also writes ``OUT.partial`` after every record, so a long
    sweep that is stopped keeps what it measured."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def write_results(records: list[dict], path: str) -> None:
    """The final JSON; the ``.partial`` file of a finished sweep goes."""
    _write(records, path)
    if os.path.exists(path + ".partial"):
        os.remove(path + ".partial")
    print(f"wrote {path}")


class BenchmarkError(RuntimeError):
    """A system failed or the systems' outputs disagree; the message says how to reproduce."""


def measure(cfgs: list[Config], systems=JAX_SYSTEMS, runs: int = 3, tl_runs: int | None = None,
            block_size: int | None = None, kv_layout: str = "bhtd",
            progress: bool = False, tile_block: int | None = None) -> list[dict]:
    """Time every system on every configuration, each in a fresh subprocess, and return their
    records (what ``main`` prints and writes). For notebooks: this process imports neither
    JAX nor tempo_lab for it, and each record's RSS is its system's own."""
    windows = {c.window for c in cfgs if c.window is not None}
    args = argparse.Namespace(runs=runs, tl_runs=tl_runs, block_size=block_size,
                              tile_block=tile_block,
                              kv_layout=kv_layout, progress=progress,
                              window=windows.pop() if windows else 64)
    if windows:
        raise ValueError("measure() takes one window size per call")
    return _measure(cfgs, list(systems), args)


def _measure(cfgs: list[Config], systems: list[str], args, on_record=None) -> list[dict]:
    root = Path(__file__).resolve().parent.parent
    records = []
    # transformers' Llama has no attention window: its reference is for causal runs only
    jobs = [(cfg, s) for cfg in cfgs for s in systems
            if not (s == "hf_generate" and cfg.window is not None)]
    bar = _bar(len(jobs), "decode benchmark", args.progress, position=0)
    with tempfile.TemporaryDirectory(prefix="tempo_lab_decode_") as tmp:
        inputs: dict[Config, str] = {}
        outputs: dict[Config, dict[str, str]] = {}
        for cfg, system in jobs:
            bar.set_description(f"{system} {cfg.label()}")
            if cfg not in inputs:       # in a subprocess too: it needs ~0.7 GB at T=1024
                inputs[cfg] = os.path.join(tmp, f"inputs_{len(inputs)}.npz")
                subprocess.run([sys.executable, "-m", "benchmarks.decode", "--prepare",
                                inputs[cfg], *_child_args(cfg, args)], cwd=root, check=True)
            save = os.path.join(tmp, f"out_{len(inputs)}_{system}.npy")
            cmd = _child_cmd(system, cfg, args)
            proc = subprocess.run(cmd + ["--inputs", inputs[cfg], "--save-output", save],
                                  cwd=root, stdout=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                bar.close()
                raise BenchmarkError(f"{system} ({cfg.label()}) failed with exit code "
                                     f"{proc.returncode}; reproduce with\n  python "
                                     f"{' '.join(cmd[1:])}")
            line = next(x for x in reversed(proc.stdout.splitlines())
                        if x.startswith(RESULT_PREFIX))
            records.append(json.loads(line[len(RESULT_PREFIX):]))
            outputs.setdefault(cfg, {})[system] = save
            if on_record:
                on_record(records)
            bar.update()
        bar.close()
        for cfg, saved in outputs.items():
            _check_agreement(cfg, {s: np.load(p) for s, p in saved.items()})
    return records


def _check_agreement(cfg: Config, got: dict[str, np.ndarray]) -> None:
    """The systems' outputs against each other (each was checked against the reference
    already); not for llama, whose correct decodes may part at a near-tie of two logits."""
    if cfg.model == "llama":
        return
    first = next(iter(got))
    for s, y in got.items():
        if not np.allclose(y, got[first], rtol=RTOL, atol=ATOL):
            raise BenchmarkError(f"{s} and {first} disagree ({cfg.label()}): max diff "
                                 f"{np.max(np.abs(y - got[first])):.3e}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        return run_one(args)
    if args.prepare:
        return prepare(args)
    tl = sys.modules.get("tempo_lab")      # honour tl.config.progress without importing it
    args.progress = (tl.config.progress if tl else True) and not args.no_progress
    out_path = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    wall0 = time.perf_counter()
    for note in _run_notes(args):
        print(f"note: {note}", file=sys.stderr)
    try:
        records = _measure(configs(args), args.systems, args,
                           on_record=lambda recs: _write(recs, out_path + ".partial"))
    except BenchmarkError as e:
        print(f"ABORT: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - wall0
    print(table(records))
    print()
    print(NOTES)
    for note in _run_notes(args):
        print(f"NOTE: {note}")
    env = records[0] if records else environment()
    print(f"\n{env['date']}, {env['processor']}, {env['cpu_count']} CPUs, jax {env['jax']} "
          f"({env['jax_device']}); total wall time {wall:.0f} s")
    executors = sorted({str(r.get("executor")) for r in records if r["system"] == "tempo_lab"})
    if executors:
        print(f"tempo_lab executor: {', '.join(executors)} (commit {env['tempo_lab_commit']})")
    write_results(records, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
