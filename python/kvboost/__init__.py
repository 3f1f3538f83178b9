"""KVBoost: a C++ LLM inference engine with chunk-level KV-cache reuse, from Python.

Quick start::

    from kvboost import KVBoost
    engine = KVBoost.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")   # Hub id, directory or .gguf
    engine.warm("You are a helpful assistant.\\n")
    r = engine.generate("You are a helpful assistant.\\nWhat is KV caching?", max_new_tokens=64)
    print(r.output_text, r.ttft_ms, r.kv_reuse_ratio)

Threads: a :class:`KVBoost` may be used from several Python threads at once; their requests run
in the engine's shared continuous batch. The GIL is released while the engine computes, and
Ctrl-C (KeyboardInterrupt) during ``generate`` cancels the request cleanly (main thread).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from ._errors import ChatTemplateError, EngineError, Error, InvalidRequestError, ModelNotFoundError
from ._native import _C

__all__ = [
    "KVBoost", "GenerationResult", "Agreement", "Tokenizer", "Stream", "resolve_model", "hf_hub_cache_dir",
    "Error", "ModelNotFoundError", "InvalidRequestError", "ChatTemplateError", "EngineError",
]
__version__ = "0.1.0"

Message = Dict[str, Any]
Prompt = Union[str, Sequence[Message]]

_STRATEGIES = {"auto": "auto", "cacheblend": "cacheblend", "selective": "selective", "prefix": "prefix", "none": "none"}
_KV_BITS = {32: "f32", 8: "int8", 4: "int4"}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}


def _bytes(v: Union[int, str, None], what: str) -> Optional[int]:
    if v is None or isinstance(v, int):
        if isinstance(v, int) and v < 0:
            raise InvalidRequestError(f"{what} = {v} must be >= 0")
        return v
    s = str(v).strip()
    num = s.rstrip("KMGiB")
    unit = s[len(num):]
    try:
        if unit not in _UNITS:
            raise ValueError
        return int(float(num) * _UNITS[unit])
    except ValueError:
        raise InvalidRequestError(f'{what} = "{v}" is not a byte count (e.g. 512MiB, 2GiB)') from None


def hf_hub_cache_dir() -> str:
    """The Hugging Face cache folder, picked exactly as huggingface_hub does ($HF_HUB_CACHE,
    $HF_HOME/hub, ~/.cache/huggingface/hub, ...)."""
    return _C.hf_hub_cache_dir()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def resolve_model(model: str, *, revision: Optional[str] = None, download: Optional[bool] = None) -> "tuple[str, str]":
    """What a model argument names, as ``(path, hub_id)``: a model directory, a .gguf file, or a
    Hugging Face id ``ORG/NAME[@REVISION][:FILE.gguf]`` found in the local Hugging Face cache.

    Not cached: with ``download`` not False, ``HF_HUB_OFFLINE`` unset and huggingface_hub
    installed, the snapshot is downloaded (``snapshot_download``; ``$HF_ENDPOINT`` is honoured);
    otherwise :class:`ModelNotFoundError` names the id, the folder searched and the command
    that downloads it. ``hub_id`` is "" for a local path."""
    arg = model if revision is None else f"{model}@{revision}"
    try:
        path, hub_id, _commit = _C.resolve_model(arg)
        return path, hub_id
    except ModelNotFoundError as e:
        parsed = _C.parse_hub_id(arg)
        if parsed is None or download is False:
            raise
        if _offline():
            raise ModelNotFoundError(f"{e} (HF_HUB_OFFLINE is set: not downloading)") from None
        try:
            import huggingface_hub
        except ImportError:
            raise ModelNotFoundError(f"{e} (huggingface_hub is not installed: cannot download)") from None
        repo, rev, file = parsed
        patterns = [file, "*.json", "*.txt", "*.model"] if file else None
        try:
            huggingface_hub.snapshot_download(repo, revision=rev, allow_patterns=patterns)
        except Exception as d:  # noqa: BLE001 - every download failure becomes our error
            raise ModelNotFoundError(f"{e}\n(downloading {repo}@{rev} failed: {type(d).__name__}: {d})") from d
        path, hub_id, _commit = _C.resolve_model(arg)
        return path, hub_id


@dataclass
class GenerationResult:
    """One generation. Times in milliseconds; ``cached_tokens`` prompt tokens came from a cache
    (exact prefix or reused chunks), of which ``recomputed_tokens`` were recomputed anyway (seam
    repair); ``kv_reuse_ratio`` = (cached - recomputed) / prompt tokens."""

    output_text: str
    token_ids: List[int]
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    cached_tokens: int
    kv_reuse_ratio: float
    finish_reason: str  # "stop" (eos or a stop string), "length", "cancelled"
    guarded: bool  # the guard recomputed an approximate prompt exactly (a close first token)
    prompt_ids: List[int] = field(default_factory=list, repr=False)
    prefix_cached_tokens: int = 0
    recomputed_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode speed after the first token."""
        n = len(self.token_ids)
        return (n - 1) * 1000.0 / self.decode_ms if self.decode_ms > 0 and n > 1 else 0.0

    @classmethod
    def _from(cls, d: Dict[str, Any]) -> "GenerationResult":
        return cls(output_text=d["text"], token_ids=list(d["output_ids"]), ttft_ms=d["ttft_ms"],
                   total_ms=d["total_ms"], prompt_tokens=len(d["prompt_ids"]), cached_tokens=d["n_reused"],
                   kv_reuse_ratio=d["reuse_ratio"], finish_reason=d["finish_reason"], guarded=d["guarded"],
                   prompt_ids=list(d["prompt_ids"]), prefix_cached_tokens=d["n_cached"],
                   recomputed_tokens=d["n_recomputed"], prefill_ms=d["prefill_ms"], decode_ms=d["decode_ms"])


@dataclass
class Agreement:
    """verify_correctness of one prompt: the reuse run's logits against a full prefill's, per
    generated position (teacher-forced on the full run's greedy output)."""

    top1_rate: float
    mean_cosine: float
    mean_kl: float
    cosine: List[float]
    kl: List[float]
    top1: List[float]
    ttft_full_ms: float
    ttft_reuse_ms: float
    reused_tokens: int
    recomputed_tokens: int
    prompt_tokens: int
    guarded: bool


class Stream:
    """``generate(..., stream=True)``: iterate for text pieces as they decode; ``result`` holds
    the GenerationResult once the iteration ends. Leaving the loop early cancels the request."""

    def __init__(self, req: Any):
        self._req = req
        self.result: Optional[GenerationResult] = None

    def __iter__(self) -> Iterator[str]:
        try:
            while True:
                piece = self._req.next_text()
                if piece is None:
                    break
                yield piece
            self.result = GenerationResult._from(self._req.finish())
        finally:
            if not self._req.done():
                self._req.cancel()

    def cancel(self) -> None:
        """Stops the request; the engine frees its KV."""
        self._req.cancel()

    def __del__(self) -> None:  # a stream dropped without being read to the end
        try:
            if not self._req.done():
                self._req.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Tokenizer:
    """The model's tokenizer (tokenizer.json), as Hugging Face's encode/decode give."""

    def __init__(self, engine: Any):
        self._e = engine

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._e.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._e.decode([int(i) for i in ids], skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tokenize: bool = False) -> Union[str, List[int]]:
        text = self._e.apply_chat_template(json.dumps(list(messages)), add_generation_prompt)
        return self._e.encode(text, False) if tokenize else text

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._e.eos_token_id

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._e.bos_token_id

    def __call__(self, text: str, add_special_tokens: bool = True) -> Dict[str, List[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}


class KVBoost:
    """A loaded model and its caches. Create with :meth:`from_pretrained`.

    Thread-safe: several threads may call generate / generate_batch / warm at once; their
    requests are batched together by the engine."""

    def __init__(self, engine: Any, model_id: str, recompute_strategy: str):
        self._e = engine
        self.model_id = model_id  # the Hub id when one was given, else the path
        self.path = engine.path
        self.recompute_strategy = recompute_strategy
        self.tokenizer = Tokenizer(engine)

    @classmethod
    def from_pretrained(cls, model: str, *, recompute_strategy: str = "auto", chunk_size: int = 128,
                        kv_cache_bits: int = 32, max_cache_bytes: Union[int, str] = "512MiB",
                        chunk_store: Optional[str] = None, threads: Optional[int] = None,
                        weight_budget: Union[int, str, None] = None, kv_budget: Union[int, str, None] = None,
                        max_batch: int = 16, head_quant: str = "auto", revision: Optional[str] = None, device: str = "cpu",
                        vram_budget: Union[int, str, None] = None, download: Optional[bool] = None, tp: int = 1,
                        **engine_options: Any) -> "KVBoost":
        """Loads ``model``: a model directory (config.json, *.safetensors, tokenizer.json), a .gguf
        file, or a Hugging Face id ``ORG/NAME[@REVISION][:FILE.gguf]`` (see :func:`resolve_model`).

        recompute_strategy: how a prompt reuses cached chunks found at other positions:
            "auto" (the default: the cheapest repair the guard's learned error allows, escalating
            selective -> cacheblend -> an exact recompute of the reused span on a close call),
            "cacheblend" (recompute the most deviated ~15% of reused tokens), "selective" (the
            first tokens of each reused run), "none" (reuse as is), "prefix" (exact prefixes only).
        chunk_size: tokens per reuse chunk. kv_cache_bits: stored chunk K/V precision, 32, 8 or 4.
        max_cache_bytes: RAM of the chunk store (0: none). chunk_store: a directory for its disk
        tier (survives restarts). threads: compute threads (process-wide; default all cores).
        weight_budget: stream layer weights from disk within this many bytes (e.g. "768M").
        kv_budget: paged KV memory. device: "cpu" (default), "cuda" or "cuda:N" (a CUDA build and
        device; InvalidRequestError for a bad value, EngineError naming the device when it is not
        usable, docs/gpu.md). vram_budget: with a CUDA device, device bytes for weights, K/V pools
        and scratch (e.g. "6GiB"); layers beyond it stream from pinned host memory through two
        device slots (InvalidRequestError on the CPU). tp: tensor parallelism over this many ranks
        (default 1: off; each rank holds its share of the heads and the MLP; with device "cuda:N"
        rank r runs on cuda:N+r; docs/gpu.md). Other keyword options go to EngineOptions (block_size,
        prefill_chunk, chunk_window, cold_dir, chunk_disk_bytes)."""
        if recompute_strategy not in _STRATEGIES:
            raise InvalidRequestError(f'recompute_strategy = "{recompute_strategy}" must be one of '
                                      + ", ".join(_STRATEGIES))
        if kv_cache_bits not in _KV_BITS:
            raise InvalidRequestError(f"kv_cache_bits = {kv_cache_bits} must be 32, 8 or 4")
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise InvalidRequestError(f"tp = {tp!r} must be an integer >= 1")
        if threads is not None:
            if threads < 1:
                raise InvalidRequestError(f"threads = {threads} must be >= 1")
            _C.set_num_threads(int(threads))
        path, hub_id = resolve_model(model, revision=revision, download=download)
        opts: Dict[str, Any] = dict(chunk_size=chunk_size, kv_quant=_KV_BITS[kv_cache_bits],
                                    chunk_ram_bytes=_bytes(max_cache_bytes, "max_cache_bytes"),
                                    chunk_store=chunk_store, weight_budget=_bytes(weight_budget, "weight_budget"),
                                    kv_budget_bytes=_bytes(kv_budget, "kv_budget"), max_batch=max_batch,
                                    head_quant=head_quant, device=device,
                                    vram_budget=_bytes(vram_budget, "vram_budget"), tp=tp)
        known = {"block_size", "prefill_chunk", "chunk_window", "cold_dir", "chunk_disk_bytes"}
        for k, v in engine_options.items():
            if k not in known:
                raise InvalidRequestError(f"from_pretrained: unknown option {k!r} (known: {', '.join(sorted(known))})")
            opts[k] = v
        return cls(_C.Engine(path, opts), hub_id or model, recompute_strategy)

    # --- prompts -----------------------------------------------------------------------------
    def _ids(self, prompt: Optional[Prompt], messages: Optional[Sequence[Message]],
             segments: Optional[Sequence[str]], add_special_tokens: bool) -> "tuple[List[int], List[int]]":
        if messages is None and prompt is not None and not isinstance(prompt, str):
            messages, prompt = prompt, None
        if messages is not None:
            if prompt is not None or segments:
                raise InvalidRequestError("give messages, or a prompt (with segments), not both")
            return self.tokenizer.apply_chat_template(messages, True, tokenize=True), []
        if segments:
            segs = list(segments) + ([prompt] if prompt else [])
            ids, starts = self._e.encode_segments(segs, add_special_tokens)
            return ids, list(starts)
        if prompt is None:
            raise InvalidRequestError("no prompt: give a prompt, messages or segments")
        return self._e.encode(prompt, add_special_tokens), []

    def _options(self, max_new_tokens: int, temperature: Optional[float], top_p: Optional[float],
                 top_k: Optional[int], stop: Union[str, Sequence[str], None], seed: Optional[int],
                 starts: List[int], extra: Dict[str, Any]) -> Dict[str, Any]:
        o = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                 stop=[stop] if isinstance(stop, str) else (list(stop) if stop else []), seed=seed or 0,
                 reuse=self.recompute_strategy, segment_starts=starts)
        known = {"min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos",
                 "prefix_cache", "cache_namespace", "repair_tokens", "blend_ratio", "guard_lead",
                 "guard_risk", "guard_tokens", "store"}
        for k, v in extra.items():
            if k not in known:
                raise InvalidRequestError(f"generate: unknown option {k!r} (known: {', '.join(sorted(known))})")
            o[k] = v
        return o

    # --- generation --------------------------------------------------------------------------
    def generate(self, prompt: Optional[Prompt] = None, *, messages: Optional[Sequence[Message]] = None,
                 max_new_tokens: int = 256, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 seed: Optional[int] = None, segments: Optional[Sequence[str]] = None, stream: bool = False,
                 add_special_tokens: bool = True, **options: Any) -> Union[GenerationResult, Stream]:
        """Generates a completion of ``prompt`` (text), or of ``messages`` (a chat, through the
        model's chat template; a list passed as ``prompt`` is taken as messages).

        segments: RAG form -- system prompt, documents, ... each tokenized and chunked on its own
        (so each reuses its cached chunks wherever it appears), ``prompt`` appended last.
        Unset sampling values take the model's generation_config.json; temperature=0 is greedy.
        stream=True returns a :class:`Stream` that yields text pieces as they decode.
        Other options: min_p, repetition_penalty, presence_penalty, frequency_penalty,
        ignore_eos, prefix_cache, cache_namespace, store (False: leave no cache trace), ...
        Raises InvalidRequestError for bad input; KeyboardInterrupt cancels."""
        ids, starts = self._ids(prompt, messages, segments, add_special_tokens)
        req = self._e.submit(ids, self._options(max_new_tokens, temperature, top_p, top_k, stop, seed, starts, options))
        if stream:
            return Stream(req)
        return GenerationResult._from(req.finish())

    def generate_batch(self, prompts: Sequence[Union[Prompt, Dict[str, Any]]], **common: Any) -> List[GenerationResult]:
        """Runs the prompts together in the engine's continuous batch and returns their results
        in order. Each item is a prompt string, a messages list, or a dict of generate()
        arguments (prompt / messages / segments and per-request options) overriding ``common``."""
        if "stream" in common:
            raise InvalidRequestError("generate_batch does not stream; use generate(stream=True) per request")
        all_ids, all_opts = [], []
        for p in prompts:
            kw = dict(common)
            if isinstance(p, dict):
                kw.update(p)
            else:
                kw["prompt"] = p
            ids, starts = self._ids(kw.pop("prompt", None), kw.pop("messages", None), kw.pop("segments", None),
                                    kw.pop("add_special_tokens", True))
            o = self._options(kw.pop("max_new_tokens", 256), kw.pop("temperature", None), kw.pop("top_p", None),
                              kw.pop("top_k", None), kw.pop("stop", None), kw.pop("seed", None), starts, kw)
            all_ids.append(ids)
            all_opts.append(o)
        return [GenerationResult._from(d) for d in self._e.run_batch(all_ids, all_opts)]

    # --- caches ------------------------------------------------------------------------------
    def warm(self, texts: Union[str, Sequence[str], None] = None, *, segments: Optional[Sequence[str]] = None,
             cache_namespace: str = "", add_special_tokens: bool = True) -> int:
        """Computes and stores (pinned in RAM) the K/V of ``texts`` -- one prompt per string, e.g.
        a system prompt -- or of one prompt made of ``segments`` (system prompt, documents: each
        chunked on its own, as generate(segments=...) will see them). A later prompt that starts
        with a warmed text, or contains a warmed segment, reuses it. Returns the number of
        tokens that were already cached."""
        n = 0
        if texts is not None:
            for t in [texts] if isinstance(texts, str) else texts:
                n += self._e.warm(self._e.encode(t, add_special_tokens), [], cache_namespace)
        if segments:
            ids, starts = self._e.encode_segments(list(segments), add_special_tokens)
            n += self._e.warm(ids, list(starts), cache_namespace)
        if texts is None and not segments:
            raise InvalidRequestError("warm: give texts or segments")
        return n

    def verify_correctness(self, prompts: Sequence[Union[str, Sequence[str]]], *, n_tokens: int = 8,
                           **options: Any) -> List[Agreement]:
        """For each prompt (a string, or a list of segments), runs it with this engine's reuse
        and with a full prefill, teacher-forced on the full run's greedy output for n_tokens
        steps, and compares the logits per position (top-1 agreement, cosine, KL). Reuse finds
        only what is cached: warm() the documents first."""
        all_ids: List[List[int]] = []
        starts_seen = []
        for p in prompts:
            if isinstance(p, str):
                all_ids.append(self._e.encode(p, True))
                starts_seen.append([])
            else:
                ids, starts = self._e.encode_segments(list(p), True)
                all_ids.append(ids)
                starts_seen.append(list(starts))
        out = []
        for ids, starts in zip(all_ids, starts_seen):
            o = self._options(n_tokens, 0.0, None, None, None, 0, starts, options)
            for a in self._e.verify_correctness([ids], o, n_tokens):
                out.append(Agreement(top1_rate=a["top1_rate"], mean_cosine=a["mean_cosine"], mean_kl=a["mean_kl"],
                                     cosine=list(a["cosine"]), kl=list(a["kl"]), top1=list(a["top1"]),
                                     ttft_full_ms=a["ttft_full_ms"], ttft_reuse_ms=a["ttft_reuse_ms"],
                                     reused_tokens=a["n_reused"], recomputed_tokens=a["n_recomputed"],
                                     prompt_tokens=a["n_prompt"], guarded=a["guarded"]))
        return out

    def cache_stats(self) -> Dict[str, Any]:
        """{"prefix_cache": paged KV block cache counters, "chunk_store": chunk store counters or None}."""
        return self._e.cache_stats()

    def flush(self) -> None:
        """Waits for the chunk store's pending disk writes."""
        self._e.flush()

    @property
    def context_length(self) -> int:
        return self._e.context_length

    def __repr__(self) -> str:
        return f"KVBoost({self.model_id!r}, recompute_strategy={self.recompute_strategy!r})"
