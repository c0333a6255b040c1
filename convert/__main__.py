"""`python -m dart_jax.convert`: inspect and re-save DART head checkpoints.

  inspect HEAD [--base BASE] [--hash]
                                 config summary, tensor list, checks (against BASE's config.json);
                                 what the checks can and cannot see; --hash: each file's SHA-256
                                 against the hub's where a reference exists (the HF cache's blob
                                 names, a shard index's total size)
  export HEAD OUT [--dtype ...] [--base BASE]
                                 re-save HEAD in the reference layout as float32 or bfloat16, for the
                                 PyTorch reference (fvliang/DART) as it is; a `warning:` line names
                                 anything the reference would not take although dart_jax does

  gguf FILE.gguf OUT             convert a Llama-family GGUF file into a HF checkpoint folder (what
                                 `--base FILE.gguf` caches), with each file's SHA-256 in its
                                 gguf_source.json; rebuilds a damaged conversion

BASE is a Qwen3 or Llama-family target (folder, hub id or Llama .gguf file).

HEAD and BASE are local folders or hub ids. A bad file, config or argument is reported as one
`error: …` line naming it, with exit code 2 (dart_jax.errors.cli_boundary).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from dart_jax.errors import cli_boundary
from dart_jax.files import check_apart

from .checksums import CAN, CANNOT, check_files
from .dart_head import (check_head, check_names, export_dart_head, head_folder, read_head_config, reference_problems,
                        tensor_files)
from .target import load_target_config
from .gguf import MANIFEST, gguf_to_folder
from .int8 import write_int8_head
from .safetensors_io import read_tensors


def _describe(folder, config, tensors) -> list[str]:
    lines = [f"DART head {folder}",
             f"  hidden {config.hidden_size}, intermediate {config.intermediate_size}, heads {config.num_attention_heads}"
             f" (kv {config.num_key_value_heads}, head_dim {config.head_dim}), taps 3x{config.fc_in // 3}",
             f"  draft_length m={config.draft_length} (d={config.num_rows} rows), draft vocab {config.draft_vocab_size}"
             f" of {config.vocab_size}",
             f"  rope_theta {config.rope_theta:g}, rope_scaling {config.rope_scaling_dict}, rms_norm_eps {config.rms_norm_eps:g}",
             "  tensors:"]
    total = 0
    for name in sorted(tensors):
        array = tensors[name]
        total += array.size
        lines.append(f"    {name:45s} {str(array.dtype):9s} {list(array.shape)}")
    lines.append(f"  {len(tensors)} tensors, {total / 1e6:.2f} M values")
    return lines


def _inspect(args) -> None:
    folder = head_folder(args.head)
    config = read_head_config(folder)
    files = tensor_files(folder)
    tensors = read_tensors(folder)
    print("\n".join(_describe(folder, config, tensors)))
    check_names(config, files, folder)
    base = load_target_config(args.base) if args.base else None
    check_head(folder, config, tensors, base, files=files)
    print("  checkpoint: tensors match config.json, weights finite, d2t/t2d consistent")
    used = np.arange(config.draft_vocab_size) + tensors["d2t"].astype(np.int64)
    print(f"  d2t maps draft ids to target ids {int(used.min())} … {int(used.max())}")
    if base is not None:
        print(f"base {args.base}: hidden {base.hidden_size}, vocab {base.vocab_size}, {base.num_hidden_layers} layers")
        print("  the head fits this base model")
    for problem in reference_problems(config, base):
        print(f"  the PyTorch reference would not take it: {problem}")
    print(f"  checked: {CAN}")
    print(f"  not checked: {CANNOT}")
    if args.hash:
        print(f"files of {folder}:")
        print("\n".join(check_files(folder)))
        if args.base and Path(os.path.expanduser(args.base)).is_dir():
            base_folder = Path(os.path.expanduser(args.base))
            print(f"files of {base_folder}:")
            print("\n".join(check_files(base_folder)))


def _export(args) -> None:
    check_apart(args.out, [("--base", args.base)], "OUT")
    target_config = load_target_config(args.base) if args.base else None
    out = export_dart_head(args.head, args.out, args.dtype, target_config)
    print(f"wrote {out}/config.json and {out}/model.safetensors ({args.dtype})")
    for problem in reference_problems(read_head_config(out), target_config):
        print(f"warning: {problem}; dart_jax runs this head, the PyTorch reference would not.", file=sys.stderr)


def _int8(args) -> None:
    out = write_int8_head(args.head, args.out)
    size = sum(f.stat().st_size for f in Path(out).iterdir() if f.is_file())
    print(f"wrote {out}/config.json and {out}/model.safetensors (int8 weights, per-row scales; {size / 1e6:.1f} MB)")


def _gguf(args) -> None:
    check_apart(args.out, [("", args.file)])
    out = gguf_to_folder(args.file, args.out)
    print(f"wrote {out} (a HF checkpoint folder; its files' SHA-256 in {out}/{MANIFEST})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dart_jax.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="summarise a DART head checkpoint and check it")
    p.add_argument("head", help="DART head folder or hub id (e.g. fvliang/qwen4b-dart)")
    p.add_argument("--base", help="base (Qwen3 or Llama-family: folder, hub id or .gguf file) to check the head "
                                  "against (reads its config only)")
    p.add_argument("--hash", action="store_true",
                   help="also hash every file (the head's, and a local --base folder's): a file from the Hugging Face "
                        "cache is compared with the hash it was downloaded under; an error names a damaged file")
    p.set_defaults(run=_inspect)
    p = sub.add_parser("export", help="re-save a DART head in the reference layout")
    p.add_argument("head", help="DART head folder or hub id")
    p.add_argument("out", help="output folder (created, or replaced if it holds only a head; its parent must exist)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the float tensors (default float32)")
    p.add_argument("--base", help="base (Qwen3 or Llama-family: folder, hub id or .gguf file) to check the head "
                                  "against first (default: none)")
    p.set_defaults(run=_export)
    p = sub.add_parser("int8", help="write an int8 copy of a draft head (DART or EAGLE-3): each 2-D weight as int8 "
                                    "with one scale per row, about half a bf16 head's size; loads like any head")
    p.add_argument("head", help="draft head folder (DART or EAGLE-3)")
    p.add_argument("out", help="output folder (created, or replaced if it holds only a head; its parent must exist)")
    p.set_defaults(run=_int8)
    p = sub.add_parser("gguf", help="convert a Llama-family GGUF file into a HF checkpoint folder (float32)")
    p.add_argument("file", help="the .gguf file")
    p.add_argument("out", help="output folder (created, or replaced if it holds only a conversion)")
    p.set_defaults(run=_gguf)
    args = parser.parse_args(argv)
    return cli_boundary(lambda: args.run(args), prog="python -m dart_jax.convert")


if __name__ == "__main__":
    sys.exit(main())
