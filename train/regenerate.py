"""Regenerating the assistant turns with the target itself (heads learn best on its own outputs).

A plain batch-1 autoregressive decode over the target's KV cache: the prompt is padded to a
bucket of 64 tokens (padding is written past the valid length and never attended), then one
jitted token step per new token. Greedy when temperature is 0, else sampling at that temperature.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.qwen3 import Qwen3, init_cache


class Regenerator:
    def __init__(self, target: Qwen3, tokenizer, *, max_new_tokens: int, temperature: float = 0.0, seed: int = 0):
        self.target, self.tokenizer = target, tokenizer
        self.max_new, self.temperature, self.seed = max_new_tokens, temperature, seed
        eos = set(target.config.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos = eos
        graph, state = nnx.split(target)
        self._state = state

        def pick(logits, key):  # logits [V]
            if temperature <= 0:
                return jnp.argmax(logits).astype(jnp.int32)
            return jax.random.categorical(key, logits / temperature).astype(jnp.int32)

        def prefill(state, ids, length, cache, key):  # ids [1,T]
            hidden, _, cache = nnx.merge(graph, state).forward_hidden(ids, cache=cache, cache_len=jnp.zeros((1,), jnp.int32))
            last = jax.lax.dynamic_index_in_dim(hidden[0], length - 1, keepdims=False)
            return pick(nnx.merge(graph, state).lm_logits(last), key), cache

        def step(state, token, cache, cache_len, key):
            model = nnx.merge(graph, state)
            hidden, _, cache = model.forward_hidden(token.reshape(1, 1), cache=cache, cache_len=cache_len.reshape(1))
            return pick(model.lm_logits(hidden[0, 0]), key), cache

        self._prefill = jax.jit(prefill, donate_argnums=3)
        self._step = jax.jit(step, donate_argnums=2)

    def continue_ids(self, prompt_ids: list[int], key_data: list[int]) -> list[int]:
        """New token ids after `prompt_ids` (a final EOS included when generation stopped on it)."""
        n = len(prompt_ids)
        bucket = -(-n // 64) * 64
        cache = init_cache(self.target.config, 1, bucket + self.max_new, self.target.dtype)
        ids = np.zeros((1, bucket), np.int32)
        ids[0, :n] = prompt_ids
        key = jax.random.key(np.random.SeedSequence([self.seed, *key_data]).generate_state(1)[0])
        key, sub = jax.random.split(key)
        token, cache = self._prefill(self._state, jnp.asarray(ids), n, cache, sub)
        out = []
        for i in range(self.max_new):
            tok = int(token)
            out.append(tok)
            if tok in self.eos or i == self.max_new - 1:
                break
            key, sub = jax.random.split(key)
            token, cache = self._step(self._state, token, cache, jnp.int32(n + i), sub)
        return out

    def conversation(self, messages: list[dict], index: int) -> list[dict]:
        """`messages` with every assistant turn replaced by the target's reply to the turns before it."""
        out = []
        for turn, msg in enumerate(messages):
            if msg["role"] != "assistant" or not out:
                out.append(msg)
                continue
            prompt = self.tokenizer.apply_chat_template(out, tokenize=False, add_generation_prompt=True)
            prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            new = [t for t in self.continue_ids(prompt_ids, [index, turn]) if t not in self.eos]
            out.append({"role": "assistant", "content": self.tokenizer.decode(new, skip_special_tokens=False)})
        return out
