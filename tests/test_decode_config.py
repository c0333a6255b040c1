"""One decode config: `DartModel.from_pretrained` takes a `DecodeConfig` (or its fields by name) and
few parameters besides, the command line builds the same config from the same fields, and a
misspelt name is an error naming the nearest valid one. The generate methods take one
`GenerationSettings` (or its fields by name) the same way."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from dart_jax import DecodeConfig
from dart_jax.api import options as generate_options
from dart_jax.api.model import DartModel
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.errors import InputError
from dart_jax.ngram import TreeSettings
from dart_jax.serve import options as serve_options

# the reference's own names, which from_pretrained keeps (under ours: base, dart, ngram, small_ngram)
REFERENCE_PARAMETERS = {"cls", "base", "dart", "ngram", "small_ngram"}

# flags as a user types them, and the Python keyword names and values that mean the same (written
# out by hand: the oracle of "the CLI and the Python API build the same config")
SAME_SETTINGS = [
    (["--keep", "16", "--beam-width", "10", "--topk", "7", "--draft-rows", "2", "--ngram-weight", "0.25"],
     dict(keep=16, beam_width=10, topk=7, draft_rows=2, ngram_weight=0.25)),
    (["--keep", "auto", "--max-keep", "15", "--min-bucket", "64", "--cache-multiple", "512"],
     dict(keep="auto", max_keep=15, min_bucket=64, cache_multiple=512)),
    (["--system", "Be brief.", "--thinking", "--device-steps", "0", "--verify-gemms", "xla", "--attention", "pallas",
      "--fused-projections", "off", "--untied-lm-head", "on"],
     dict(system_prompt="Be brief.", enable_thinking=True, device_steps=0, verify_gemms="xla", attention="pallas",
          fused_projections=False, untied_lm_head=True)),
    (["--eagle3-total-token", "8", "--eagle3-depth", "2", "--eagle3-top-k", "8", "--tree-topk", "5"],
     dict(eagle3_total_token=8, eagle3_depth=2, eagle3_top_k=8, topk=5)),
    ([], {}),
]


def test_from_pretrained_takes_a_config_and_few_parameters_besides():
    params = inspect.signature(DartModel.from_pretrained.__func__).parameters
    ours = [name for name in params if name not in REFERENCE_PARAMETERS]
    assert "config" in ours and len(ours) <= 8, ours


@pytest.mark.parametrize("flags, names", SAME_SETTINGS)
def test_the_cli_and_the_python_api_build_the_same_config(flags, names):
    from_python = DecodeConfig.build(**names)
    assert DecodeConfig.from_args(generate_options.parse_args(flags)) == from_python
    # the server pads prompts to at least SERVE_MIN_BUCKET tokens unless told otherwise (its one own default)
    served = DecodeConfig.build(**{"min_bucket": serve_options.SERVE_MIN_BUCKET, **names})
    assert DecodeConfig.from_args(serve_options.parse_args(flags)) == served
    # and each value given landed in its field (not a default that happens to agree)
    assert all(getattr(from_python, name) == value for name, value in names.items())


def test_every_config_field_has_one_flag_whose_value_is_that_field():
    ap = argparse.ArgumentParser()
    generate_options.add_model_options(ap)
    dests = {action.dest: action for action in ap._actions}
    for field in dataclasses.fields(DecodeConfig):
        assert field.name in dests, f"DecodeConfig.{field.name} has no flag"
        assert dests[field.name].option_strings[0] == "--" + {"system_prompt": "system", "enable_thinking": "thinking"}.get(
            field.name, field.name).replace("_", "-")


@pytest.mark.parametrize("name, nearest", [("beam_widht", "beam_width"), ("max_kep", "max_keep"),
                                           ("atention", "attention"), ("eagle3_totaltoken", "eagle3_total_token")])
def test_a_misspelt_option_names_the_nearest_valid_one(name, nearest):
    # before any file is read: the paths do not exist
    with pytest.raises(InputError, match=rf"unknown option '{name}'; did you mean '{nearest}'\?"):
        DartModel.from_pretrained("/no/such/base", "/no/such/head", **{name: 3})


def test_settings_objects_give_their_fields_and_a_tree_fixes_its_size():
    tree = TreeSettings(keep=9, beam_width=4, topk=6)
    assert DecodeConfig.build(tree=tree) == DecodeConfig(keep=9, beam_width=4, topk=6)
    # "auto" with a tree object: the object's size is the largest tree
    assert DecodeConfig.build(tree=tree, keep="auto") == DecodeConfig(keep="auto", max_keep=9, beam_width=4, topk=6)
    assert DecodeConfig.build(DecodeConfig(min_bucket=8), shapes=ShapeSettings(cache_multiple=64)) == DecodeConfig(
        min_bucket=32, cache_multiple=64)
    with pytest.raises(InputError, match="max_keep only applies with keep='auto'"):
        DecodeConfig(keep=7, max_keep=15)


def test_a_model_is_built_from_its_config(tiny_demo_paths):
    base, head, trie = tiny_demo_paths
    config = DecodeConfig(keep=5, beam_width=3, topk=4, min_bucket=16, system_prompt="Be brief.")
    by_config = DartModel.from_pretrained(base, head, trie, config=config)
    by_names = DartModel.from_pretrained(base, head, trie, keep=5, beam_width=3, topk=4, min_bucket=16,
                                         system_prompt="Be brief.")
    for model in (by_config, by_names):
        assert (model.engine.tree.keep, model.engine.tree.beam_width, model.engine.tree.topk) == (5, 3, 4)
        assert not model.engine.adaptive and model.engine.shapes.min_bucket == 16
        assert model.chat_settings.system_prompt == "Be brief."
    # names over a config: the names win, the rest of the config stays
    over = DartModel.from_pretrained(base, head, trie, config=config, keep="auto", max_keep=6)
    assert over.engine.adaptive and over.engine.tree.keep == 6 and over.engine.tree.beam_width == 3


@pytest.fixture(scope="module")
def tiny_demo_paths():
    from dart_jax.api.model import demo_paths

    return demo_paths("tiny")


@pytest.fixture(scope="module")
def tiny_model(tiny_demo_paths):
    return DartModel.from_pretrained(*tiny_demo_paths, keep=4)


def test_generation_settings_by_name_or_object_are_one_thing(tiny_model):
    by_names = tiny_model.generate([1, 2, 3], max_new_tokens=5, chat=False)
    by_object = tiny_model.generate([1, 2, 3], settings=GenerationSettings(max_new_tokens=5), chat=False)
    assert len(by_names.token_ids) <= 5 and by_names.token_ids == by_object.token_ids
    # a name over an object replaces that field only
    longer = tiny_model.generate_ar([1, 2, 3], settings=GenerationSettings(max_new_tokens=5), max_new_tokens=7,
                                    chat=False)
    assert longer.token_ids[:len(by_names.token_ids)] == by_names.token_ids
    with pytest.raises(InputError, match=r"unknown argument 'max_new_token'; did you mean 'max_new_tokens'\?"):
        tiny_model.generate([1, 2, 3], max_new_token=5)
    with pytest.raises(InputError, match=r"unknown argument 'temprature'; did you mean 'temperature'\?"):
        tiny_model.stream([1, 2, 3], temprature=0.5)
