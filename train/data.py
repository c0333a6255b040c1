"""Training data: JSONL conversations → chat-templated token ids with an assistant loss mask,
and deterministic batches with sampled anchors.

Accepted lines (one JSON object each; blank lines are ignored):
- ShareGPT style: {"conversations": [{"from": "human"|"gpt"|"system"|…, "value": "…"}, …]}
- OpenAI style:   {"messages": [{"role": "user"|"assistant"|"system", "content": "…"}, …]}
"""
from __future__ import annotations

import functools
import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dart_jax.convert.base_files import check_base_files
from dart_jax.errors import FileFormatError, InputError, check_text, load_tokenizer_folder, not_utf8, parse_json
from dart_jax.files import atomic_path

from .masks import sample_anchors

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


def _parse_record(obj) -> list[dict]:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, found {type(obj).__name__}")
    if "conversations" in obj:
        turns, role_key, text_key = obj["conversations"], "from", "value"
    elif "messages" in obj:
        turns, role_key, text_key = obj["messages"], "role", "content"
    else:
        raise ValueError(f"expected a 'conversations' (ShareGPT) or 'messages' (OpenAI) list, found keys {sorted(obj)}")
    if not isinstance(turns, list) or not turns:
        raise ValueError("the conversation must be a non-empty list of turns")
    messages = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise ValueError(f"turn {j} must be an object with '{role_key}' and '{text_key}'")
        role, text = turn[role_key], turn[text_key]
        if not isinstance(text, str):
            raise ValueError(f"turn {j}: '{text_key}' must be a string, found {type(text).__name__}")
        if role not in _ROLES:
            raise ValueError(f"turn {j}: unknown role {role!r}; known: {sorted(_ROLES)}")
        check_text(text, f"turn {j}: '{text_key}'")
        messages.append({"role": _ROLES[role], "content": text})
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant turn to train on")
    return messages


def read_conversations(path, *, skip_bad: bool = False) -> tuple[list[list[dict]], int]:
    """(conversations as lists of {role, content}, number of skipped bad lines).

    A malformed line raises ValueError naming the file and line number, unless `skip_bad`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data {path} not found; pass a JSONL file with --data")
    conversations, bad = [], 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:  # a binary file, or another encoding
                if not skip_bad:
                    raise not_utf8(path, err, f" on line {lineno}") from None
                bad += 1
                continue
            if not line.strip():
                continue
            try:
                conversations.append(_parse_record(parse_json(line, f"{path} line {lineno}", "one JSON object a line")))
            except ValueError as err:  # InputError (a FileFormatError too) is a ValueError
                if not skip_bad:
                    where = "" if isinstance(err, FileFormatError) else f"{path} line {lineno}: "
                    raise InputError(f"{where}{err}. Fix the line or pass --skip-bad to skip such lines.") from None
                bad += 1
    if not conversations:
        raise ValueError(f"{path} holds no usable conversation ({bad} bad lines skipped)")
    return conversations, bad


def _render(tokenizer, messages, generation_prompt: bool) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception:  # noqa: BLE001 — a template may reject partial conversations; the caller falls back
        return None


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans produced by its assistant turns.

    A turn's span is the text its message adds after the generation prompt (content and the
    end-of-turn marker), found by rendering the conversation up to it. Templates that render
    earlier turns differently from the last one (Qwen3 drops the empty think block of earlier
    turns) fall back to locating the content and the end-of-turn text that follows it.
    """
    full = _render(tokenizer, messages, False)
    if full is None:
        raise ValueError("the tokenizer's chat template rejected a conversation; check the roles' order")
    spans, cursor = [], 0
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True) if i else None
        upto = _render(tokenizer, messages[: i + 1], False)
        if before is not None and upto is not None and upto.startswith(before) and full.startswith(upto) and len(upto) > cursor:
            start, end = max(len(before), cursor), len(upto)
        else:
            start = full.find(msg["content"], cursor)
            if start < 0 or not msg["content"]:
                continue
            end = start + len(msg["content"])
            if upto is not None and msg["content"] in upto:
                tail = upto[upto.rindex(msg["content"]) + len(msg["content"]):].rstrip("\n")
                if tail and full.startswith(tail, end):
                    end += len(tail)
        spans.append((start, end))
        cursor = end
    return full, spans


def encode_conversation(tokenizer, messages: list[dict], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32[n], loss_mask bool[n]) with n <= max_length; the mask marks assistant tokens."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], np.int32)[:max_length]
    offsets = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)[:max_length]
    mask = np.zeros(len(ids), bool)
    for start, end in spans:
        mask |= (offsets[:, 0] < end) & (offsets[:, 1] > start)
    return ids, mask


def load_tokenizer(base):
    """The target's fast tokenizer (offsets are needed for the loss mask)."""
    if Path(base).is_dir():
        check_base_files(base)
    tok = load_tokenizer_folder(base)
    if not tok.is_fast:
        raise ValueError(f"the tokenizer of {base} has no fast (Rust) version; the loss mask needs offset mappings")
    if not tok.chat_template:
        raise ValueError(f"the tokenizer of {base} has no chat_template; training data is rendered with it")
    return tok


@dataclass
class Dataset:
    """Encoded samples; `ids[i]` int32[n_i], `loss_mask[i]` bool[n_i]."""

    ids: list[np.ndarray]
    loss_mask: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.ids)

    def save(self, path) -> None:
        """Written to a temporary file first, so that a killed run never leaves half a file."""
        lengths = np.asarray([len(x) for x in self.ids], np.int64)
        with atomic_path(os.path.abspath(path)) as tmp, open(tmp, "wb") as f:  # a file object: savez adds no ".npz"
            np.savez(f, lengths=lengths, ids=np.concatenate(self.ids) if self.ids else np.zeros(0, np.int32),
                     loss_mask=np.concatenate(self.loss_mask) if self.ids else np.zeros(0, bool))

    def digest(self) -> str:
        """sha256 of the token ids, sample by sample (what the target's taps depend on)."""
        h = hashlib.sha256(np.asarray([len(x) for x in self.ids], np.int64).tobytes())
        for x in self.ids:
            h.update(np.ascontiguousarray(x, np.int32).tobytes())
        return h.hexdigest()

    @classmethod
    def load(cls, path) -> "Dataset":
        """The samples `save` wrote; a damaged file (truncated, or arrays that disagree) is a
        FileFormatError naming it."""
        f = read_npz(path, ("lengths", "ids", "loss_mask"))
        lengths, ids, mask = f["lengths"], f["ids"], f["loss_mask"]
        if (lengths.ndim != 1 or ids.ndim != 1 or mask.shape != ids.shape or not np.issubdtype(lengths.dtype, np.integer)
                or not np.issubdtype(ids.dtype, np.integer) or (lengths < 0).any() or lengths.sum() != len(ids)):
            raise FileFormatError(path, f"its arrays disagree (lengths {lengths.shape} summing to "
                                        f"{int(lengths.sum()) if lengths.size else 0}, ids {ids.shape}, loss_mask "
                                        f"{mask.shape}): the file is damaged.")
        cut = np.cumsum(lengths)[:-1]
        return cls(list(np.split(ids, cut)), list(np.split(mask.astype(bool), cut)))


def read_npz(path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays `names` of a .npz file the trainer wrote (never unpickled); a truncated or
    otherwise damaged file is a FileFormatError naming it."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {name: f[name] for name in names}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise FileFormatError(path, f"cannot be read ({type(e).__name__}: {str(e)[:120]}): the file is damaged "
                                    "or truncated.") from None


def encode_dataset(tokenizer, conversations, max_length: int, *, progress: bool = True) -> tuple[Dataset, int]:
    """(Dataset, number of conversations dropped because no assistant token survived the cut)."""
    ids, masks, dropped = [], [], 0
    for messages in tqdm(conversations, desc="tokenize", disable=not progress):
        x, mask = encode_conversation(tokenizer, messages, max_length)
        if mask[2:].any():  # an anchor needs a target two positions on (see masks.py)
            ids.append(x)
            masks.append(mask)
        else:
            dropped += 1
    if not ids:
        raise ValueError(f"no sample has an assistant token within --max-length {max_length}")
    return Dataset(ids, masks), dropped


@functools.lru_cache(maxsize=2)
def epoch_order(n: int, epoch: int, seed: int) -> np.ndarray:
    """The sample order of an epoch: a permutation fixed by (seed, epoch), so resuming replays it."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_samples(n: int, epoch: int, index: int, batch_size: int, seed: int) -> np.ndarray:
    """The samples of batch `index` of `epoch`, in row order (fewer than batch_size in the last)."""
    return epoch_order(n, epoch, seed)[index * batch_size:(index + 1) * batch_size]


def pad_length(longest: int, max_length: int, multiple: int = 64) -> int:
    """Batches are padded to a multiple of `multiple` (at most max_length) to bound recompilation."""
    return int(min(max_length, -(-longest // multiple) * multiple))


def make_batch(data: Dataset, epoch: int, index: int, *, batch_size: int, anchors: int, max_length: int, seed: int,
               pad_id: int = 0) -> dict[str, np.ndarray]:
    """Batch `index` of `epoch`: ids int32[B,T], loss_mask bool[B,T], anchors int32[B,K],
    anchor_valid bool[B,K]. The last batch of an epoch is filled with empty rows (no anchors)."""
    order = batch_samples(len(data), epoch, index, batch_size, seed)
    t = pad_length(max(len(data.ids[i]) for i in order), max_length)
    batch = {"ids": np.full((batch_size, t), pad_id, np.int32), "loss_mask": np.zeros((batch_size, t), bool),
             "anchors": np.zeros((batch_size, anchors), np.int32), "anchor_valid": np.zeros((batch_size, anchors), bool)}
    for row, i in enumerate(order):
        n = len(data.ids[i])
        batch["ids"][row, :n] = data.ids[i]
        batch["loss_mask"][row, :n] = data.loss_mask[i]
        rng = np.random.default_rng([seed, epoch, int(i)])
        batch["anchors"][row], batch["anchor_valid"][row] = sample_anchors(data.loss_mask[i], n, anchors, rng)
    return batch


def batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)
