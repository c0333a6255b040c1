"""Regenerating the assistant turns with the target itself (heads learn best on its own outputs),
by plain decoding (a pool of one slot over an `AutoregressiveDecoder`, stepped by the pool
driver): greedy when temperature is 0, else sampling at that temperature, one seed per
(conversation, turn)."""
from __future__ import annotations

import numpy as np

from dart_jax.decoding.autoregressive import AutoregressiveDecoder
from dart_jax.decoding.driver import decode
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.models.qwen3 import Qwen3


def stop_ids(target: Qwen3, tokenizer) -> list[int]:
    """The ids that end an answer: the target config's EOS ids and the tokenizer's EOS, sorted."""
    eos = {int(e) for e in target.config.eos_token_ids}
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    return sorted(eos)


class Regenerator:
    def __init__(self, target: Qwen3, tokenizer, *, max_new_tokens: int, temperature: float = 0.0, seed: int = 0):
        self.tokenizer = tokenizer
        self.max_new, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.eos = set(stop_ids(target, tokenizer))
        # prompts are padded to multiples of 64: few compiled prefill shapes
        self.decoder = AutoregressiveDecoder(target, ShapeSettings(min_bucket=64, cache_multiple=64),
                                             eos_ids=self.eos)

    def continue_ids(self, prompt_ids: list[int], key_data: list[int]) -> list[int]:
        """New token ids after `prompt_ids` (a final EOS included when generation stopped on it)."""
        seed = int(np.random.SeedSequence([self.seed, *key_data]).generate_state(1)[0])
        settings = GenerationSettings(max_new_tokens=self.max_new, max_length=len(prompt_ids) + self.max_new,
                                      temperature=self.temperature, seed=seed)
        return [t for event in decode(self.decoder, prompt_ids, settings) for t in event.ids]

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
