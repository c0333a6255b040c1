"""The small files of a base model folder that third-party code reads without our checks:
config.json's `layer_types` (transformers' tokenizer loading validates it against
num_hidden_layers with an error of its own), the chat template (a syntax error surfaced at the
first prompt), generation_config.json's `eos_token_id` (an id outside the vocabulary never stops
anything). `check_base_files` checks them before anything is loaded; each error names the file,
what is wrong and what to do.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from dart_jax.errors import TOKENIZER_JSON, FileFormatError, read_json

_SAMPLE = [{"role": "user", "content": "Hello"}]


def _json(path: Path) -> Any:
    return read_json(path, "JSON; restore the file from the model's repository.")


def check_layer_types(config: dict, where) -> None:
    """config.json's `layer_types`, when it is a list, names one type per layer."""
    layers, types = config.get("num_hidden_layers"), config.get("layer_types")
    if isinstance(types, list) and isinstance(layers, int) and not isinstance(layers, bool) and len(types) != layers:
        raise FileFormatError(where, f"layer_types lists {len(types)} layers but num_hidden_layers is {layers}; "
                                     "make them agree (or remove layer_types).")


def chat_templates(folder: Path) -> list[tuple[Path, str, str]]:
    """(file, name, template) of every chat template the tokenizer would read from `folder`:
    chat_template.jinja, else tokenizer_config.json's `chat_template` (a string, or a list of
    {name, template})."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return [(jinja, "default", jinja.read_text(encoding="utf-8"))]
        except UnicodeDecodeError as e:
            raise FileFormatError(jinja, f"not UTF-8 text (byte {e.start}); restore the file from the model's "
                                         "repository.") from None
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return []
    content = _json(config)
    template = content.get("chat_template") if isinstance(content, dict) else None
    if isinstance(template, str):
        return [(config, "default", template)]
    if isinstance(template, list):
        return [(config, str(t.get("name")), t["template"]) for t in template
                if isinstance(t, dict) and isinstance(t.get("template"), str)]
    return []


def check_chat_template(path: Path, name: str, template: str) -> None:
    """A chat template that compiles and renders a one-message conversation."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        render_jinja_template(conversations=[_SAMPLE], chat_template=template, add_generation_prompt=True)
    except TemplateError as e:
        line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        label = "" if name == "default" else f" ({name!r})"
        raise FileFormatError(path, f"the chat template{label} is broken ({type(e).__name__}{line}: {e}); restore it "
                                    "from the model's repository, or pass --no-chat to feed raw text.") from None


def check_generation_eos(path: Path, vocab_size: int | None) -> None:
    """generation_config.json's `eos_token_id`: absent, null, a token id or a list of token ids,
    each within the vocabulary."""
    config = _json(path)
    if not isinstance(config, dict):
        raise FileFormatError(path, "expected a JSON object; restore the file from the model's repository.")
    eos = config.get("eos_token_id")
    if eos is None:
        return
    ids = eos if isinstance(eos, list) else [eos]
    top = f"[0, {vocab_size})" if vocab_size else "[0, vocab_size)"
    for e in ids:
        if isinstance(e, bool) or not isinstance(e, int) or e < 0 or (vocab_size and e >= vocab_size):
            raise FileFormatError(path, f"eos_token_id must be a token id in {top} or a list of them, got {eos!r}; "
                                        "fix it (the tokenizer's EOS id is in tokenizer_config.json) or remove it.")


def check_base_files(folder: str | os.PathLike) -> None:
    """Check a local base folder's config.json, chat template, generation_config.json and the
    tokenizer's small JSON files (those that are there) before anything reads them."""
    folder = Path(folder)
    for name in TOKENIZER_JSON:  # transformers' parser recurses into them: deep nesting is a RecursionError there
        if (folder / name).is_file():
            _json(folder / name)
    config_path = folder / "config.json"
    config = _json(config_path) if config_path.is_file() else {}
    if isinstance(config, dict):
        check_layer_types(config, config_path)
    for path, name, template in chat_templates(folder):
        check_chat_template(path, name, template)
    generation = folder / "generation_config.json"
    if generation.is_file():
        vocab = config.get("vocab_size") if isinstance(config, dict) else None
        check_generation_eos(generation, vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None)
