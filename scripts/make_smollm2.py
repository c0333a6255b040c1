"""Rebuild the real demo from scratch: SmolLM2-135M-Instruct, a DART head trained by our trainer,
and its n-gram trie, offline, with fixed seeds. Each stage prints its time; each can be rerun
alone and resumes where it stopped (answers are appended as they come, training resumes from its
last checkpoint).

    python scripts/make_smollm2.py prompts    # instruction prompts made offline, split by source
    python scripts/make_smollm2.py answers    # the model's own greedy answers (batched plain decoding)
    python scripts/make_smollm2.py extra      # every other prompt outside the held-out split, and its answers
    python scripts/make_smollm2.py trie       # order-3 trie of all the training answers, SmolLM2 tokens
    python scripts/make_smollm2.py head       # python -m dart_jax.train on the first answers, 3 epochs (background it)
    python scripts/make_smollm2.py more       # 2 more epochs from that head at half the learning rate
    python scripts/make_smollm2.py wider      # 2 more epochs from that head on all the answers (the shipped head)
    python scripts/make_smollm2.py broad      # 2 300 chat prompts of new templates and 800 new code prompts, answered
    python scripts/make_smollm2.py tune       # the `wider` head trained on the broad answers (not shipped)
    python scripts/make_smollm2.py vocab      # the shipped head grown to a 12 288-id draft vocabulary (not shipped)
    python scripts/make_smollm2.py eagle3     # an EAGLE-3 head on the same answers, 2 epochs (background it)
    python scripts/make_smollm2.py ship       # both heads (int8) and the trie into dart_jax/demo/smollm2/
    python scripts/make_smollm2.py all        # every stage in order

Prompts come from two domains. Code: the public functions and classes of the Python standard
library, read with `ast` from its source files (nothing is imported), asked for as "write a
function that ...", "explain ...". Chat: general questions built from a list of topics and
question templates. The held-out split (for evaluation; kept out of the head's training data and
of the trie) is every prompt of one source module in ten (code) and one topic in ten (chat),
chosen by a hash of the module or topic name. The first stages use 1 100 code and 600 chat
prompts; `extra` adds every remaining prompt outside the held-out split (451 code, 550 chat, as
a second file, so that the first answers keep their indices), and `wider` trains on both.
`broad` adds chat (the weak half) and code prompts none of those hold: every training topic asked
with MORE_QUESTIONS' templates, and 800 functions and classes asked with the template after the
one drawn for them, shuffled together (a run cut short keeps both domains); its answers come from
`python -m dart_jax.train.distill` (batched plain decoding, resumed per conversation). `tune`
trains the `wider` head (or, with --init, another head) on them with the taps cache (an experiment:
its head accepted no more on the held-out prompts, so `ship` keeps the `wider` head).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "out" / "smollm2"
SHIP = ROOT / "dart_jax" / "demo" / "smollm2"
SEED = 0

TOPICS = """photosynthesis; the water cycle; black holes; the French Revolution; compound interest; vaccines; climate
change; plate tectonics; the immune system; machine learning; the Roman Empire; volcanoes; the stock market; DNA;
electric cars; the solar system; healthy sleep; meditation; inflation; the Internet; renewable energy; coffee;
the human heart; rainbows; earthquakes; democracy; recycling; the Moon; gravity; bees; the printing press;
time management; public speaking; learning a new language; job interviews; saving money; starting a garden;
baking bread; running a marathon; writing a resume; the Great Wall of China; ancient Egypt; the Renaissance;
World War I; the Industrial Revolution; the theory of evolution; antibiotics; the ozone layer; coral reefs;
rain forests; deserts; glaciers; hurricanes; electricity; magnets; the speed of light; atoms; chemical
reactions; the periodic table; nutrition; exercise; stress; friendship; teamwork; leadership; creativity;
critical thinking; reading books; music; painting; photography; chess; soccer; the Olympic Games; traveling on
a budget; camping; cooking pasta; making tea; dogs; cats; birds; whales; dinosaurs; the pyramids; Shakespeare;
poetry; the history of computers; smartphones; social media; online privacy; passwords; cloud computing;
databases; open source software; algorithms; sorting; recursion; binary numbers; prime numbers; fractions;
probability; statistics; geometry; the Pythagorean theorem; calculus; budgets; taxes; small businesses;
marketing; customer service; negotiation; email etiquette; remote work; city planning; public transport;
bicycles; airplanes; trains; the ocean; rivers; mountains; forests; farming; water pollution; air quality""".replace(
    "\n", " ")
QUESTIONS = ["What is {t}?", "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
             "Why is {t} important?", "Write a short paragraph about {t}.", "What are the main ideas behind {t}?",
             "How would you explain {t} to a child?", "List some common misconceptions about {t}.",
             "Write a short poem about {t}.", "What are the pros and cons of {t}?"]
# the `more` stage's chat templates (the held-out chat prompts use QUESTIONS only)
MORE_QUESTIONS = ["Tell me about {t}.", "What should a beginner know about {t}?", "Describe {t} in a few sentences.",
                  "How does {t} affect everyday life?", "What is the most surprising thing about {t}?",
                  "Write a short story that involves {t}.", "Give me a step-by-step introduction to {t}.",
                  "What questions do people often ask about {t}?", "What are the biggest challenges related to {t}?",
                  "Summarize {t} in five bullet points.", "Write a haiku about {t}.",
                  "What would the world be like without {t}?", "Explain {t} to a high school student.",
                  "What key terms should someone learn about {t}?",
                  "Write a short dialogue between two friends talking about {t}.",
                  "What advice would you give someone interested in {t}?", "How has {t} changed over time?",
                  "Can you give me a quick overview of {t}?", "What are some good ways to learn more about {t}?",
                  "Write a short blog post introduction about {t}."]
SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip", "__pycache__",
              "pydoc_data", "venv"}


def held_out(name: str) -> bool:
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % 10 == 0


def summary(doc: str) -> str | None:
    first = " ".join(doc.strip().split("\n\n")[0].split())
    first = first.split(". ")[0].rstrip(".")
    if not 20 <= len(first) <= 160 or any(c in first for c in "<>{}|@`") or first.lower().startswith(
            ("deprecated", "internal", "helper", "return self", "implement", "same as")):
        return None
    return first


def code_prompts(other: bool = False) -> list[dict]:
    """One prompt per documented public function or class, its template drawn at random; `other`:
    the next template instead of the drawn one (the same draws, so the same order), for new prompts
    about the same code."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rng = random.Random(SEED)
    out = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if SKIP_PARTS & set(rel.parts) or rel.name.startswith("_") and rel.name != "__init__.py":
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            text = summary(doc) if doc else None
            if text is None:
                continue
            lower = text[0].lower() + text[1:]
            if isinstance(node, ast.FunctionDef):
                args = ", ".join(a.arg for a in node.args.args if a.arg not in ("self", "cls"))
                choices = [f"Write a Python function `{node.name}({args})` that does the following: {lower}.",
                           f"Explain what the Python function `{module}.{node.name}` does, with a short example.",
                           f"In Python, how would I {lower.rstrip('.')}? Show code."]
            else:
                choices = [f"Write a Python class `{node.name}`: {lower}.",
                           f"Explain the Python class `{module}.{node.name}` and show how to use it."]
            pick = choices.index(rng.choice(choices))
            out.append({"domain": "code", "source": module, "prompt": choices[(pick + other) % len(choices)]})
    return out


def chat_prompts(questions: list[str] = QUESTIONS) -> list[dict]:
    topics = [t.strip() for t in TOPICS.split(";") if t.strip()]
    return [{"domain": "chat", "source": t, "prompt": q.format(t=t)} for t in topics for q in questions]


def stage_prompts(args) -> None:
    code, chat = code_prompts(), chat_prompts()
    rng = random.Random(SEED)
    rng.shuffle(code)
    train = [p for p in code if not held_out(p["source"])][:args.code] + \
            [p for p in chat if not held_out(p["source"])][:args.chat]
    evals = [p for p in code if held_out(p["source"])][:args.eval] + \
            [p for p in chat if held_out(p["source"])][:args.eval]
    rng.shuffle(evals)
    WORK.mkdir(parents=True, exist_ok=True)
    for name, rows in (("prompts_train.jsonl", train), ("prompts_eval.jsonl", evals)):
        with open(WORK / name, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print(f"prompts: {len(train)} for training ({sum(p['domain'] == 'code' for p in train)} code), {len(evals)} "
          f"held out, from {len(code)} code and {len(chat)} chat candidates")


def base_model() -> Path:
    from dart_jax.convert.packaged import smollm2_gguf

    return smollm2_gguf()


def remaining_prompts() -> list[dict]:
    """The prompts outside the held-out split that the first `--code 1100 --chat 600` left out, in
    the `prompts` stage's order (its selection is a prefix of these lists)."""
    code, chat = code_prompts(), chat_prompts()
    random.Random(SEED).shuffle(code)
    train = [json.loads(line) for line in open(WORK / "prompts_train.jsonl")]
    used = {(p["source"], p["prompt"]) for p in train}
    return [p for p in code + chat if not held_out(p["source"]) and (p["source"], p["prompt"]) not in used]


def stage_extra(args) -> None:
    with open(WORK / "prompts_extra.jsonl", "w") as f:
        for row in remaining_prompts():
            f.write(json.dumps(row) + "\n")
    answer(args, WORK / "prompts_extra.jsonl", WORK / "train_extra.jsonl")


def all_answers() -> Path:
    """train.jsonl and train_extra.jsonl (when made) as one file, train_all.jsonl."""
    out = WORK / "train_all.jsonl"
    with open(out, "w") as f:
        for name in ("train.jsonl", "train_extra.jsonl"):
            if (WORK / name).is_file():
                f.write((WORK / name).read_text())
    return out


def stage_answers(args) -> None:
    answer(args, WORK / "prompts_train.jsonl", WORK / "train.jsonl")


def answer(args, prompts_path: Path, out_path: Path) -> None:
    from transformers import AutoTokenizer

    from dart_jax.convert.target import target_folder
    from dart_jax.decoding.autoregressive import AutoregressiveDecoder
    from dart_jax.decoding.driver import decode_together
    from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
    from dart_jax.models.checkpoints import load_target

    folder = target_folder(base_model())
    tok = AutoTokenizer.from_pretrained(str(folder))
    target = load_target(folder)
    prompts = [json.loads(line) for line in open(prompts_path)]
    done = set()
    if out_path.exists():
        done = {json.loads(line)["index"] for line in open(out_path) if line.strip()}
    ids = {i: tok(tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], tokenize=False,
                                          add_generation_prompt=True), add_special_tokens=False)["input_ids"]
           for i, p in enumerate(prompts) if i not in done}
    order = sorted(ids, key=lambda i: len(ids[i]))
    eos = sorted({int(tok.eos_token_id), *target.config.eos_token_ids})
    decoder = AutoregressiveDecoder(target, ShapeSettings(min_bucket=64, cache_multiple=64), eos_ids=eos)
    start = time.time()
    made = 0
    with open(out_path, "a") as f:
        for b in range(0, len(order), args.batch):
            rows = order[b:b + args.batch]
            settings = [GenerationSettings(max_new_tokens=args.max_new, max_length=len(ids[i]) + args.max_new)
                        for i in rows]
            outs = decode_together(decoder, [ids[i] for i in rows], settings)
            for i, new in zip(rows, outs):
                text = tok.decode([t for t in new if t not in eos], skip_special_tokens=False)
                msgs = [{"role": "user", "content": prompts[i]["prompt"]}, {"role": "assistant", "content": text}]
                f.write(json.dumps({"index": i, "domain": prompts[i]["domain"], "source": prompts[i]["source"],
                                    "messages": msgs}) + "\n")
                made += len(new)
            f.flush()
            rate = made / (time.time() - start)
            print(f"answers: {b + len(rows)}/{len(order)} prompts, {made} tokens, {rate:.0f} tokens/s", flush=True)
    print(f"answers: done in {time.time() - start:.0f} s")


def stage_trie(args) -> None:
    from transformers import AutoTokenizer

    from dart_jax.convert.target import target_folder

    folder = target_folder(base_model())
    tok = AutoTokenizer.from_pretrained(str(folder))
    seqs = WORK / "trie_ids.jsonl"
    with open(seqs, "w") as f:
        for line in open(all_answers()):
            conv = json.loads(line)["messages"]
            text = tok.apply_chat_template(conv, tokenize=False)
            f.write(json.dumps(tok(text, add_special_tokens=False)["input_ids"]) + "\n")
    cmd = [sys.executable, "-m", "dart_jax.ngram", "build", str(seqs), "-o", str(WORK / "ngram_csr.trie"), "--order", "3"]
    subprocess.run(cmd, check=True)
    cmd = [sys.executable, "-m", "dart_jax.ngram", "compress", str(WORK / "ngram_csr.trie"), str(WORK / "ngram.trie")]
    subprocess.run(cmd, check=True)


def train_dart(args, data: Path, out: str, epochs: int, lr: float, seed: int, init: Path | None = None,
               extra: tuple[str, ...] = ()) -> None:
    """`python -m dart_jax.train` of a DART head on `data` into WORK/`out` (from the head folder
    `init` when given, which keeps its draft vocabulary unless `extra` grows it), `extra` flags last."""
    start = ["--init-head", str(init)] if init else ["--draft-vocab", str(args.draft_vocab)]
    cmd = [sys.executable, "-m", "dart_jax.train", "--base", str(base_model()), "--data", str(data),
           "--out", str(WORK / out), *start, "--epochs", str(epochs), "--max-length", "384",
           "--anchors-per-seq", str(args.anchors), "--batch-size", "4", "--lr", str(lr), "--seed", str(seed),
           "--save-every", "50", "--log-every", "25", "--dtype", "float32", *extra]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def stage_head(args) -> None:
    train_dart(args, WORK / "train.jsonl", "run", args.epochs, args.lr, SEED)


def stage_more(args) -> None:
    """Two more epochs from the first head at half the learning rate (the head shipped before `wider`)."""
    train_dart(args, WORK / "train.jsonl", "run2", 2, args.lr / 2, SEED + 1, init=WORK / "run" / "head")


def stage_wider(args) -> None:
    """Two more epochs from the `more` head on all the answers (the first ones and `extra`'s), at
    half the learning rate: the shipped DART head."""
    train_dart(args, all_answers(), "run3", 2, args.lr / 2, SEED + 2, init=WORK / "run2" / "head")


def stage_broad(args) -> None:
    code = code_prompts(other=True)
    random.Random(SEED).shuffle(code)
    rows = [p for p in code if not held_out(p["source"])][:args.broad_code] + \
           [p for p in chat_prompts(MORE_QUESTIONS) if not held_out(p["source"])]
    random.Random(SEED + 3).shuffle(rows)
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "prompts_broad.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    cmd = [sys.executable, "-m", "dart_jax.train.distill", str(WORK / "prompts_broad.jsonl"),
           str(WORK / "train_broad.jsonl"), "--base", str(base_model()), "--max-new-tokens", str(args.max_new),
           "--slots", str(args.batch)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def stage_tune(args) -> None:
    """The `wider` head (or --init) trained on the broad answers at a quarter of the learning rate,
    the target's taps computed once (the cache pass) and read back in the later epochs."""
    init = Path(args.init) if args.init else WORK / "run3" / "head"
    train_dart(args, WORK / "train_broad.jsonl", "run4", args.tune_epochs, args.lr / 4, SEED + 4, init=init,
               extra=("--taps", "cache"))


def stage_vocab(args) -> None:
    """The shipped head (or --init) with its draft vocabulary grown to --grow-vocab ids (the broad
    answers' most frequent tokens it lacks; their LM-head columns mapped from the target's rows),
    trained on the broad answers; the taps cache of the `tune` stage is read when it is there."""
    init = Path(args.init) if args.init else SHIP / "head"
    train_dart(args, WORK / "train_broad.jsonl", "run5", args.tune_epochs, args.lr / 2, SEED + 5, init=init,
               extra=("--draft-vocab", str(args.grow_vocab), "--taps", "cache", "--taps-dir", str(WORK / "run4" / "taps")))


def stage_eagle3(args) -> None:
    """EAGLE-3 on the same data, draft vocabulary size and context, with the published recipe's 7
    unrolled steps: 2 epochs cost this CPU about what DART's 3 + 2 did (a step unrolls 7 draft
    forwards and 7 LM heads over every position)."""
    cmd = [sys.executable, "-m", "dart_jax.train", "--method", "eagle3", "--base", str(base_model()),
           "--data", str(WORK / "train.jsonl"), "--out", str(WORK / "run_eagle3"), "--draft-vocab", str(args.draft_vocab),
           "--max-length", "384", "--batch-size", "4", "--lr", str(args.lr), "--epochs", "2", "--ttt-steps", "7",
           "--seed", str(SEED), "--save-every", "25", "--log-every", "25", "--dtype", "float32"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def stage_ship(args) -> None:
    import shutil

    from dart_jax.convert.int8 import write_int8_head

    SHIP.mkdir(parents=True, exist_ok=True)
    # the wider stage's head (tune's did not accept more on the held-out prompts: benchmarks/RESULTS.md)
    dart = WORK / ("run3" if (WORK / "run3" / "head" / "config.json").is_file() else "run2") / "head"
    write_int8_head(dart, SHIP / "head")  # int8 + per-row scales (docs/spec.md §1.1)
    if (WORK / "run_eagle3" / "head" / "config.json").is_file():
        write_int8_head(WORK / "run_eagle3" / "head", SHIP / "eagle3")
    shutil.copyfile(WORK / "ngram.trie", SHIP / "ngram.trie")
    with open(SHIP / "prompts_eval.jsonl", "w") as f:  # the held-out prompts, in `bench e2e --prompts` form
        for n, line in enumerate((WORK / "prompts_eval.jsonl").read_text().splitlines()):
            row = json.loads(line)
            f.write(json.dumps({"id": f"{row['domain']}-{n}", "category": row["domain"], "source": row["source"],
                                "prompt": row["prompt"]}) + "\n")
    print(f"shipped {SHIP}: " + ", ".join(f"{p.relative_to(SHIP)} {p.stat().st_size / 1e6:.1f} MB"
                                          for p in sorted(SHIP.rglob("*")) if p.is_file()))


STAGES = {"prompts": stage_prompts, "answers": stage_answers, "extra": stage_extra, "trie": stage_trie,
          "head": stage_head, "more": stage_more, "wider": stage_wider, "broad": stage_broad, "tune": stage_tune,
          "vocab": stage_vocab,
          "eagle3": stage_eagle3, "ship": stage_ship}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=[*STAGES, "all"])
    p.add_argument("--code", type=int, default=1100, help="code prompts for training")
    p.add_argument("--chat", type=int, default=600, help="chat prompts for training")
    p.add_argument("--eval", type=int, default=40, help="held-out prompts per domain")
    p.add_argument("--batch", type=int, default=32, help="answers decoded together")
    p.add_argument("--max-new", type=int, default=256, help="new tokens per answer")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--anchors", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--broad-code", type=int, default=800, help="code prompts of the broad stage")
    p.add_argument("--tune-epochs", type=int, default=2)
    p.add_argument("--init", help="the head `tune` (default: the wider stage's) or `vocab` (default: the shipped "
                                  "one) starts from")
    p.add_argument("--grow-vocab", type=int, default=12288, help="the draft vocabulary of the `vocab` stage's head")
    args = p.parse_args()
    for name in (list(STAGES) if args.stage == "all" else [args.stage]):
        start = time.time()
        STAGES[name](args)
        print(f"stage {name}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
