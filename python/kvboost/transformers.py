"""A transformers-shaped adapter, so that an existing script switches with one import::

    from kvboost.transformers import AutoModelForCausalLM     # was: from transformers import ...
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
    out = model.generate(input_ids, max_new_tokens=32, do_sample=False)   # [batch, prompt + new]

``generate`` returns the prompt followed by the generated ids, one row per input row, rows that
stop early padded with ``pad_token_id``; left padding (``attention_mask`` 0) is kept in
the output as transformers keeps it, but never shown to the engine -- a torch.LongTensor when torch is importable and the
input was a tensor (or ``return_tensors="pt"``), else lists."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from . import InvalidRequestError, KVBoost

__all__ = ["AutoModelForCausalLM"]


def _as_rows(input_ids: Any) -> "tuple[List[List[int]], bool]":
    is_tensor = hasattr(input_ids, "tolist") and not isinstance(input_ids, list)
    rows = input_ids.tolist() if is_tensor else input_ids
    if rows and isinstance(rows[0], int):
        rows = [rows]
    return [[int(t) for t in r] for r in rows], is_tensor


class _Config:
    def __init__(self, engine: KVBoost):
        self.name_or_path = engine.model_id
        self.max_position_embeddings = engine.context_length
        self.eos_token_id = engine.tokenizer.eos_token_id
        self.bos_token_id = engine.tokenizer.bos_token_id


class KVBoostForCausalLM:
    """What :meth:`AutoModelForCausalLM.from_pretrained` returns: ``generate`` and ``config``."""

    def __init__(self, engine: KVBoost):
        self.engine = engine
        self.config = _Config(engine)
        self.name_or_path = engine.model_id

    def generate(self, input_ids: Any = None, *, attention_mask: Any = None, max_new_tokens: Optional[int] = None,
                 max_length: Optional[int] = None, do_sample: bool = False, temperature: Optional[float] = None,
                 top_p: Optional[float] = None, top_k: Optional[int] = None, repetition_penalty: Optional[float] = None,
                 eos_token_id: Union[int, Sequence[int], None] = None, pad_token_id: Optional[int] = None,
                 seed: Optional[int] = None, return_tensors: Optional[str] = None, **kwargs: Any) -> Any:
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        if kwargs.pop("num_beams", 1) != 1:
            raise InvalidRequestError("kvboost generate: num_beams > 1 is not supported")
        kwargs.pop("use_cache", None)
        if kwargs:
            raise InvalidRequestError(f"kvboost generate: unsupported arguments {sorted(kwargs)}")
        full, is_tensor = _as_rows(input_ids)
        rows = full
        if attention_mask is not None:
            mask, _ = _as_rows(attention_mask)
            rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(full, mask)]
        if not rows or any(not r for r in rows):
            raise InvalidRequestError("kvboost generate: empty input_ids")
        if max_new_tokens is None:
            max_new_tokens = max(0, (max_length or 20) - max(len(r) for r in rows))
        eos = self.config.eos_token_id if eos_token_id is None else eos_token_id
        pad = pad_token_id if pad_token_id is not None else (eos if isinstance(eos, int) else (eos[0] if eos else 0))
        e = self.engine
        # Generated ids come back with the stop/eos id included, as transformers keeps it.
        reqs = [dict(_ids=r) for r in rows]
        opts = dict(max_new_tokens=max_new_tokens, temperature=(temperature if temperature is not None else 1.0)
                    if do_sample else 0.0, top_p=top_p if do_sample else None, top_k=top_k if do_sample else None,
                    seed=seed, repetition_penalty=repetition_penalty)
        o = e._options(opts.pop("max_new_tokens"), opts.pop("temperature"), opts.pop("top_p"), opts.pop("top_k"),
                       None, opts.pop("seed"), [], {k: v for k, v in opts.items() if v is not None})
        if isinstance(eos, (list, tuple)) and len(eos) > 1:
            raise InvalidRequestError("kvboost generate: several eos_token_id values are not supported")
        results = e._e.run_batch([q["_ids"] for q in reqs], [dict(o) for _ in reqs])
        out = [r + list(d["output_ids"]) for r, d in zip(full, results)]  # padding kept, as transformers does
        width = max(len(r) for r in out)
        out = [r + [pad] * (width - len(r)) for r in out]
        if is_tensor or return_tensors == "pt":
            try:
                import torch
            except ImportError:
                return out
            return torch.tensor(out, dtype=torch.long)
        return out

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise InvalidRequestError("kvboost models do not expose forward(); use generate()")


class AutoModelForCausalLM:
    """``from_pretrained(model_id_or_path, **options)`` -> a model whose ``generate`` matches
    transformers'. Options are :meth:`kvboost.KVBoost.from_pretrained`'s (``torch_dtype``,
    ``device_map``, ``trust_remote_code`` and ``low_cpu_mem_usage`` are accepted and ignored:
    the engine runs on the CPU in its own precision)."""

    @staticmethod
    def from_pretrained(model: str, *args: Any, **kwargs: Any) -> KVBoostForCausalLM:
        for k in ("torch_dtype", "device_map", "trust_remote_code", "low_cpu_mem_usage", "attn_implementation"):
            kwargs.pop(k, None)
        if args:
            raise InvalidRequestError("kvboost from_pretrained: pass options by keyword")
        kwargs.setdefault("recompute_strategy", "prefix")
        return KVBoostForCausalLM(KVBoost.from_pretrained(model, **kwargs))
