"""Build the offline demo model set shipped in dart_jax/demo/ (a developer tool, needs torch).

1. a byte-level BPE tokenizer trained on scripts/demo_corpus.jsonl, with a Qwen-style chat template;
2. a tiny Qwen3 target trained with transformers until it answers the corpus questions fluently;
3. a DART head trained on the target with `python -m dart_jax.train` (run separately, see --help);
4. the n-gram trie of the corpus.

    python scripts/make_demo.py target      # steps 1 and 2 (a few minutes on 2 CPU cores)
    python scripts/make_demo.py head        # step 3
    python scripts/make_demo.py trie        # step 4
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dart_jax.bench.tiny import SPECIALS, save_chat_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "scripts" / "demo_corpus.jsonl"
DEMO = ROOT / "dart_jax" / "demo"


def conversations():
    return [json.loads(line)["messages"] for line in CORPUS.read_text().splitlines() if line.strip()]


def encode_chat(tok, conv, add_generation_prompt=False) -> list[int]:
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def make_tokenizer(out: Path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [m["content"] for conv in conversations() for m in conv] + ["user", "assistant", "system"]
    trainer = trainers.BpeTrainer(vocab_size=480, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return save_chat_tokenizer(tok, out)


def train_target(out: Path, steps: int, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    tok = make_tokenizer(out)
    vocab = ((len(tok) + 63) // 64) * 64
    config = Qwen3Config(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                         tie_word_embeddings=True, rope_theta=10000.0, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = Qwen3ForCausalLM(config)
    seqs = []
    for conv in conversations():
        seqs.append(torch.tensor(encode_chat(tok, conv)))
    longest = max(len(s) for s in seqs)
    batch = torch.full((len(seqs), longest), tok.pad_token_id)
    labels = torch.full((len(seqs), longest), -100)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
        labels[i, : len(s)] = s
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        loss = model(input_ids=batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")],
                     pad_token_id=tok.pad_token_id, do_sample=False).save_pretrained(out)
    conv = conversations()[1][:1]
    prompt = torch.tensor([encode_chat(tok, conv, add_generation_prompt=True)])
    out_ids = model.generate(prompt, max_new_tokens=80, do_sample=False)
    print(tok.decode(out_ids[0, prompt.shape[1]:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["target", "head", "trie"])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=120, help="head training epochs over the corpus")
    args = ap.parse_args(argv)
    if args.what == "target":
        train_target(DEMO / "base", args.steps, args.seed)
    elif args.what == "trie":
        from transformers import AutoTokenizer

        from dart_jax.ngram import Trie

        tok = AutoTokenizer.from_pretrained(DEMO / "base")
        seqs = []
        for conv in conversations():
            seqs.append(encode_chat(tok, conv))
        Trie.build(seqs, order=3).save(DEMO / "ngram.trie")
    else:
        run = ROOT / "out" / "demo_head"
        cmd = [sys.executable, "-m", "dart_jax.train", "--base", str(DEMO / "base"), "--data", str(CORPUS),
               "--out", str(run), "--regenerate", "--regen-max-new", "200", "--draft-length", "7",
               "--max-length", "512", "--anchors-per-seq", "96", "--batch-size", "4", "--epochs", str(args.epochs),
               "--lr", "3e-3", "--save-every", "200", "--seed", str(args.seed)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        shutil.rmtree(DEMO / "head", ignore_errors=True)
        shutil.copytree(run / "head", DEMO / "head")


if __name__ == "__main__":
    main()
