"""One word per concept on every command line (DESIGN.md, "Vocabulary"): a flag that names one of
the concepts below is listed here with its concept, means that concept in every command that has
it, and no command has two flags (other than one flag's aliases) for one concept. A new flag whose
name touches a concept's words fails here until it is listed, so a second name for a concept is a
decision, not an accident."""
from __future__ import annotations

import argparse
import re

import pytest

from dart_jax.api import options as generate_options
from dart_jax.bench import options as bench_options
from dart_jax.bench import profile as bench_profile
from dart_jax.serve import options as serve_options
from dart_jax.train import options as train_options

# every flag whose name holds one of these words names a concept of the table below
CONCEPT_WORDS = re.compile(r"keep|budget|node|tree|draft|depth|rows|topk|top-k|total-token|remain|eagle3")

# flag → (its concept, a pattern its help text matches in every command: the one meaning); aliases
# (older spellings) are the later option strings of the same flag
FLAGS = {
    "--keep": ("tree size", r"tree size \(nodes besides the root\)"),
    "--keeps": ("tree sizes, a list", r"tree sizes"),
    "--max-keep": ("the largest tree keep='auto' may choose", r"largest tree"),
    "--keep-last": ("checkpoints kept by training", r"checkpoints"),
    "--topk": ("candidates per draft row", r"candidates per row"),
    "--top-k": ("sampling top-k", r"sampling top-k"),
    "--draft-rows": ("draft rows a tree spans (the depth d)", r"\bdepth\b"),
    "--draft-length": ("the head's mask slots m (d = m + 1 rows)", r"mask slots"),
    "--draft-vocab": ("the head's draft vocabulary size", r"vocabulary"),
    "--draft-reps": ("timed calls of each drafter", r"timed calls"),
    "--ngram-weight": ("weight of the n-gram term in the tree search", r"n-gram term"),
    "--eagle3": ("an EAGLE-3 head", r"EAGLE-3 head"),
    "--eagle3-total-token": ("EAGLE-3 tree nodes, root included", r"root included"),
    "--eagle3-depth": ("EAGLE-3 draft steps", r"draft steps"),
    "--eagle3-top-k": ("EAGLE-3 children per node", r"children per"),
    "--init-head": ("a head to start training from", r"start from"),
}
ALIASES = {"--budgets": "--keeps", "--tree-topk": "--topk"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser (bench's subcommands each apart), built as the commands build them."""
    built = {}

    class Built(Exception):
        pass

    def capture(name, parse):
        def keep(self, *args, **kwargs):
            built[name] = self
            raise Built

        original = argparse.ArgumentParser.parse_args
        argparse.ArgumentParser.parse_args = keep
        try:
            parse([])
        except Built:
            pass
        finally:
            argparse.ArgumentParser.parse_args = original

    capture("generate", generate_options.parse_args)
    capture("serve", serve_options.parse_args)
    built["train"] = train_options.build_parser()
    built["train.distill"] = train_options.build_distill_parser()
    built["bench.profile"] = bench_profile.build_parser()
    bench = bench_options.build_parser()
    for action in bench._actions:
        if isinstance(action, argparse._SubParsersAction):
            built.update({f"bench {name}": sub for name, sub in action.choices.items()})
    return built


PARSERS = _parsers()


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_each_concept_has_one_flag_and_one_meaning(command):
    concepts = {}
    for action in PARSERS[command]._actions:
        flags = [s for s in action.option_strings if s.startswith("--")]
        if not flags or not any(CONCEPT_WORDS.search(flag) for flag in flags):
            continue
        name, aliases = flags[0], flags[1:]
        assert name in FLAGS, (f"{command}: {name} names a concept of DESIGN.md's vocabulary but is not in this "
                               "test's table: use the concept's flag, or list it with its meaning")
        for alias in aliases:
            assert ALIASES.get(alias) == name, f"{command}: {alias} is an alias of {name} not listed in ALIASES"
        concept, meaning = FLAGS[name]
        assert re.search(meaning, action.help or ""), (f"{command}: {name} does not mean {concept} here (its help: "
                                                       f"{action.help!r:.80}); one flag, one meaning")
        assert concept not in concepts, f"{command}: {name} and {concepts.get(concept)} are two flags for {concept}"
        concepts[concept] = name
    # the old spellings are aliases only, never a flag of their own
    own = {action.option_strings[0] for action in PARSERS[command]._actions if action.option_strings}
    assert not set(ALIASES) & own, f"{command}: an old spelling stands as a flag of its own"


def test_the_table_covers_the_commands():
    """Each concept flag of the table is some command's (a flag removed leaves no stale entry)."""
    everywhere = {s for parser in PARSERS.values() for action in parser._actions for s in action.option_strings}
    assert set(FLAGS) <= everywhere, sorted(set(FLAGS) - everywhere)
    assert set(ALIASES) <= everywhere
