"""The sparse mixture-of-experts block of Qwen3-MoE targets (`model_type` "qwen3_moe").

A Qwen3-MoE model is the `Qwen3` module over a config with experts: each decoder layer holds this
block or the dense `qwen3.MLP`, as `Qwen3Config.sparse_layer` says, so the cached forwards
(`extend`, `verify`), `forward_hidden` and the taps are the dense model's code.

The block's rule is transformers' Qwen3MoeSparseMoeBlock (docs/spec.md §2.2): router logits in the
model's dtype, softmax over the experts in float32, the k largest probabilities (renormalised to
sum 1 when `norm_topk_prob`) cast back to the model's dtype, and the output the sum over the k
chosen experts of weight · down(silu(gate(x)) · up(x)).

The experts are stacked, one tensor per projection ([E, H, I] for gate and up, [E, I, H] for
down), so that one einsum serves every row of a call. Two ways compute the same sum, chosen from
the static shape: a call of N rows with N·k < E (one-token decoding) gathers each row's k experts'
weights and reads N·k expert matrices; a larger call (a tree verification, a prompt) runs every
expert over every row with the unchosen experts' weights zero, which reads each expert once, fewer
bytes than gathering, at E/k times the gathered FLOPs. A grouped matmul over the experts a call
touches would read only those; it is not used.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .layers import Linear, param

EXPERT_AXES = ("experts", "embed", "mlp")  # gate and up projections [E, H, I]; down is [E, I, H]


class SparseMoeBlock(nnx.Module):
    """Router + stacked experts of one sparse layer (see the module doc); x [B,T,H] → [B,T,H]."""

    def __init__(self, c, *, dtype, param_dtype, rngs: nnx.Rngs | None):
        e, h, i = c.num_experts, c.hidden_size, c.moe_intermediate_size
        # the router is small and every device needs all its logits for the top-k: replicated
        self.gate = Linear(h, e, ("embed", None), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = param((e, h, i), EXPERT_AXES, param_dtype, rngs)
        self.up_proj = param((e, h, i), EXPERT_AXES, param_dtype, rngs)
        self.gate_up_proj = None  # `fuse_projections`: gate and up in one [E, H, 2I] tensor instead
        self.down_proj = param((e, i, h), ("experts", "mlp", "embed"), param_dtype, rngs)
        self.top_k, self.norm_topk_prob, self.intermediate_size = c.num_experts_per_tok, c.norm_topk_prob, i
        self.dtype = dtype

    def fuse_projections(self) -> None:
        """gate and up projections of every expert as one [E, H, 2I] tensor (`Qwen3.fuse_projections`)."""
        if self.gate_up_proj is not None:
            return
        fused = jnp.concatenate([self.gate_proj.get_value(), self.up_proj.get_value()], axis=-1)
        self.gate_up_proj = nnx.data(nnx.Param(fused, logical_axes=EXPERT_AXES))
        del self.gate_proj, self.up_proj

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [N,H] → (weights [N,k] in the model's dtype, expert indices [N,k])."""
        logits = self.gate(x)  # [N,E]
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        weights, experts = jax.lax.top_k(probs, self.top_k)  # [N,k]
        if self.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return weights.astype(logits.dtype), experts

    def _gate_up(self, spec: str, x: jax.Array, experts: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """gate and up projections of x by the einsum `spec`, over every expert (`experts` None) or
        over the gathered experts [N,k] of each row."""
        def kernel(var):
            w = var[...].astype(self.dtype)
            return w if experts is None else w[experts]  # [E,H,·] or [N,k,H,·]

        if self.gate_up_proj is not None:
            y = jnp.einsum(spec, x, kernel(self.gate_up_proj))
            return y[..., :self.intermediate_size], y[..., self.intermediate_size:]
        return jnp.einsum(spec, x, kernel(self.gate_proj)), jnp.einsum(spec, x, kernel(self.up_proj))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, h = x.shape
        n = b * t
        flat = x.reshape(n, h).astype(self.dtype)
        with jax.named_scope("router"):
            weights, experts = self.route(flat)  # [N,k]
        down = self.down_proj[...].astype(self.dtype)
        with jax.named_scope("experts"):
            if n * self.top_k < down.shape[0]:
                gate, up = self._gate_up("nh,nkhi->nki", flat, experts)  # [N,k,I]
                act = jax.nn.silu(gate) * up * weights[..., None]
                out = jnp.einsum("nki,nkih->nh", act, down[experts])
            else:
                gate, up = self._gate_up("nh,ehi->nei", flat, None)  # [N,E,I]
                # each row's weight on every expert, zero where it was not chosen: [N,E]
                dense = jnp.zeros((n, down.shape[0]), weights.dtype).at[jnp.arange(n)[:, None], experts].set(weights)
                act = jax.nn.silu(gate) * up * dense[..., None]
                out = jnp.einsum("nei,eih->nh", act, down)
        return out.reshape(b, t, h)
