"""Qwen3 reference built from transformers' own Qwen2 classes (transformers 4.49, torch 1.13).

Why an adapter: transformers gained Qwen3ForCausalLM in 4.51, but from 4.50 on every model module
imports torch.distributed.tensor, which torch 1.13 (Debian's python3-torch, the only torch we
install) does not have, so those releases cannot even import LlamaForCausalLM here. Stubbing torch
internals to force 4.51 in would make the oracle depend on a hack that could silently change
numerics; instead we take Qwen2 from the pinned release, which is Qwen3's architecture except for:

  * q_norm / k_norm: an RMSNorm over head_dim (weights of shape [head_dim]), applied to every
    query and key head after the projection and BEFORE RoPE (transformers 4.51
    `Qwen3Attention.forward`: `q_norm(q_proj(x).view(..., head_dim))`);
  * no hard-wired q/k/v bias: all four projections take `config.attention_bias` (default False),
    including o_proj;
  * head_dim comes from the config (default 128), and need not equal hidden_size / n_heads.

Everything else (RMSNorm, SwiGLU MLP, rotate-half RoPE and its scaling types, GQA, the causal mask,
the DynamicCache) is transformers' Qwen2 code unchanged. The RMSNorm is transformers'
`Qwen2RMSNorm`, the same formula as 4.51's `Qwen3RMSNorm` (float32 variance, eps inside rsqrt).
The attention forward below is 4.49's `Qwen2Attention.forward` with the two norm calls added.
"""

from typing import Callable

from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen2 import modeling_qwen2 as q2
from torch import nn

QWEN3_DEFAULTS = {
    # Qwen3Config defaults (transformers 4.51) where they differ from Qwen2Config's.
    "head_dim": 128,
    "attention_bias": False,
}


def qwen3_config(raw: dict) -> Qwen2Config:
    """A Qwen2Config carrying a Qwen3 config.json's fields (model_type dropped)."""
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    for k, v in QWEN3_DEFAULTS.items():
        fields.setdefault(k, v)
    return Qwen2Config(**fields)


class Qwen3Attention(q2.Qwen2Attention):
    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        bias = bool(config.attention_bias)
        h, d = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(h, config.num_attention_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, config.num_key_value_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, config.num_key_value_heads * d, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * d, h, bias=bias)
        self.q_norm = q2.Qwen2RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = q2.Qwen2RMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None,
                cache_position=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        # The one difference from Qwen2: per-head RMSNorm on q and k, before RoPE.
        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = q2.apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if past_key_value is not None:
            cache_kwargs = {"sin": sin, "cos": cos, "cache_position": cache_position}
            key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, cache_kwargs)

        sliding_window = None
        if (self.config.use_sliding_window and getattr(self.config, "sliding_window", None) is not None
                and self.layer_idx >= self.config.max_window_layers):
            sliding_window = self.config.sliding_window

        attention_interface: Callable = q2.eager_attention_forward
        if self.config._attn_implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]

        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, sliding_window=sliding_window, **kwargs)

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM with Qwen3Attention in every layer; loads Qwen3 checkpoints' tensor names
    (model.layers.N.self_attn.{q,k}_norm.weight) unchanged."""

    def __init__(self, config):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = Qwen3Attention(config, i)
        self.post_init()
