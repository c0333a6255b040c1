"""Issue 50, the Python API: arguments of the wrong type and values that were silently taken the
wrong way (truthy strings as booleans, floats truncated, strings parsed, a string read as prompts,
unordered or one-shot collections of prompts). Each must end in an InputError naming the argument
and what it takes, before any file is read or any decoding begins; the oracles are the expected
message, guards that fail when the work starts, and the results of the same prompts given as a
list, never the code's own output for the bad input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dart_jax.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "dart_jax" / "demo"


@pytest.fixture(scope="module")
def tiny():
    from dart_jax.api.model import DartModel

    return DartModel.demo("tiny", keep=16)


@pytest.fixture
def no_decoding(tiny, monkeypatch):
    """The model, whose decoding (a pool of a batch, one prompt's steps) fails the test when it begins."""
    def refuse(*_a, **_k):
        raise AssertionError("decoding began before the arguments were checked")
    for owner, name in ((tiny, "batcher"), (tiny.engine, "batcher")):
        monkeypatch.setattr(owner, name, refuse)
    return tiny


@pytest.fixture
def no_loading(monkeypatch):
    """from_pretrained, which fails the test when it reads the DART head's folder."""
    from dart_jax.api import model

    monkeypatch.setattr(model, "head_folder", lambda *_: pytest.fail("a file was read before the options were checked"))
    return lambda **opts: model.DartModel.from_pretrained(DEMO / "base", DEMO / "head", DEMO / "ngram.trie", **opts)


def G(**fields):
    from dart_jax.decoding.settings import GenerationSettings

    return GenerationSettings(**fields)


IDS = [1, 375, 266, 203]


# -- wrong types that reached an AttributeError or TypeError deep inside ----------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate("hi", settings={"max_new_tokens": 3}),
     r"^settings must be a GenerationSettings \(GenerationSettings\(\*\*d\) makes one of a dict d\), got dict"),
    (lambda m: m.generate("hi", settings=5), r"^settings must be a GenerationSettings, got int 5\.$"),
    (lambda m: m.generate("hi", settings=[G()]), r"^settings must be a GenerationSettings \(a list holds one per "
                                                 r"prompt of a batch\), got list"),
    (lambda m: m.generate(["hi", "yo"], settings=[G(), {"max_new_tokens": 2}]),
     r"^settings\[1\] must be a GenerationSettings \(GenerationSettings\(\*\*d\)"),
    (lambda m: m.generate(["hi", "yo"], settings=[G(), None]), r"^settings\[1\] must be a GenerationSettings, got "
                                                                r"NoneType None"),
    (lambda m: m.generate(["hi", "yo"], settings=[G()]), r"^1 settings for 2 prompts"),
    (lambda m: m.generate(["hi", "yo"], settings="fast"), r"^settings must be a GenerationSettings, or a list of one "
                                                          r"per prompt, got str 'fast'"),
    (lambda m: m.generate_many(["hi"], {"max_new_tokens": 2}), r"^settings must be a GenerationSettings, or a list"),
    (lambda m: m.generate_ar("hi", settings=5), r"^settings must be a GenerationSettings, got int 5"),
    (lambda m: m.stream("hi", settings=5), r"^settings must be a GenerationSettings, got int 5"),
    # stream checks at the call, not at the first step: nothing below iterates it
    (lambda m: m.stream("hi", result="x"), r"^result must be a list \(the GenerationResult is appended to it\) or "
                                            r"None, got str 'x'"),
    (lambda m: m.stream("hi", stats=5), r"^stats must be a Stats \(dart_jax.decoding.requests.Stats\) or None, got "
                                        r"int 5"),
    (lambda m: m.generate_many(["hi"], G(), on_done=5), r"^on_done must be a function of the number of prompts that "
                                                         r"finished \(or None\), got int 5"),
    (lambda m: m.generate(np.array(IDS)), r"^the prompt is an array \(ndarray\); pass prompt.tolist\(\)"),
    (lambda m: m.generate(np.array([IDS, IDS])), r"^the prompt is an array \(ndarray\)"),
    (lambda m: m.generate(np.array(["hi", "yo"])), r"^the prompt is an array \(ndarray\)"),
    (lambda m: m.generate(np.array("hi")), r"^the prompt is an array \(ndarray\)"),
    (lambda m: m.encode(np.array(IDS)), r"^the prompt is an array \(ndarray\)"),
    (lambda m: m.dart_generate([IDS], max_new_token_num=2, remain_total="16"),
     r"^remain_total must be an integer, got str '16'"),
])
def test_wrong_types_are_named_before_any_decoding(no_decoding, call, message):
    with pytest.raises(InputError, match=message):
        call(no_decoding)


@pytest.mark.parametrize("opts, message", [
    (dict(tree={"keep": 3}), r"^tree must be a TreeSettings or None \(or its fields by name: "
                             r"from_pretrained\(\.\.\., \*\*tree\) for a dict\), got dict"),
    (dict(shapes={"min_bucket": 8}), r"^shapes must be a ShapeSettings or None"),
    (dict(chat="be brief"), r"^chat must be a ChatSettings or None .*got str 'be brief'"),
    (dict(trie_cache_dir=5), r"^trie_cache_dir must be a folder \(str or Path\) or None, got int 5"),
    (dict(system_prompt=5), r"^system_prompt must be a string or None, got int 5"),
    (dict(system_prompt="caf\ud800e"), r"^system_prompt is not valid Unicode text: a lone surrogate U\+D800"),
    (dict(enable_thinking="no"), r"^enable_thinking must be True or False, got str 'no'"),
    # truthy strings turned these on
    (dict(untied_lm_head="no"), r"^untied_lm_head must be True or False, got str 'no'"),
    (dict(fused_projections="yes"), r"^fused_projections must be True or False, got str 'yes'"),
    (dict(small_ngram="no"), r"^small_ngram must be True or False, got str 'no'"),
    (dict(is_small_ngram="no"), r"^is_small_ngram must be True or False, got str 'no'"),
    (dict(small_ngram=1), r"^small_ngram must be True or False, got int 1"),
    # refused by the command line (--eagle3-depth without --eagle3), taken and ignored here
    (dict(eagle3_depth=-1), r"^eagle3_depth: EAGLE-3 tree sizes, but no EAGLE-3 head is loaded; pass eagle3=PATH"),
    (dict(eagle3_total_token=0, eagle3_top_k=4), r"^eagle3_total_token, eagle3_top_k: EAGLE-3 tree sizes, but no"),
    (dict(keep="auto", max_keep=7.5), r"^max_keep must be an integer, got float 7.5"),
    (dict(min_bucket=2.5), r"^min_bucket must be an integer, got float 2.5"),
    (dict(cache_multiple="256"), r"^cache_multiple must be an integer, got str '256'"),
])
def test_from_pretrained_checks_its_options_before_reading_a_file(no_loading, opts, message):
    with pytest.raises(InputError, match=message):
        no_loading(**opts)


def test_from_modules_checks_its_settings_objects(tiny):
    from dart_jax.api.model import DartModel

    with pytest.raises(InputError, match=r"^tree must be a TreeSettings or None"):
        DartModel.from_modules(tiny.target, tiny.head, tiny.tokenizer, eos_ids=[0], tree={"keep": 3})


# -- values that were silently taken the wrong way ----------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate_many("hi", G()), r"^generate_many takes a list of prompts, got one string; pass \[prompt\], "
                                           r"or call generate\(prompt\)"),
    (lambda m: m.generate(memoryview(b"hi")), r"^the prompt is a memoryview; pass text \(bytes\(prompt\)"),
    (lambda m: m.generate({"hi", "yo"}), r"^the prompt is a set, whose order is arbitrary .* pass a list"),
    (lambda m: m.generate(frozenset(IDS)), r"^the prompt is a frozenset, whose order is arbitrary"),
    (lambda m: m.generate_many({"hi", "yo"}, G()), r"^the prompt is a set, whose order is arbitrary"),
    (lambda m: m.generate({"hi": 1}.keys()), r"^the prompt is a dict_keys, whose order is arbitrary"),
    (lambda m: m.generate(["hi", "yo"], batch_size=1.5), r"^batch_size must be an integer, got float 1.5"),
    (lambda m: m.generate(["hi", "yo"], batch_size="2"), r"^batch_size must be an integer, got str '2'"),
    (lambda m: m.generate("hi", batch_size=0), r"^batch_size must be an integer >= 1, got 0"),
    (lambda m: m.generate_many(["hi"], G(), batch_size=2.0), r"^batch_size must be an integer, got float 2.0"),
    (lambda m: m.dart_generate([IDS], top_p=-0.5), r"^top_p must lie in \[0, 1\] \(0: no top-p filter, as in the "
                                                   r"reference\), got -0.5"),
    (lambda m: m.dart_generate([IDS], top_p=float("nan")), r"^top_p must lie in \[0, 1\].*got nan"),
    (lambda m: m.dart_generate([IDS], top_p=1.5), r"^top_p must lie in \[0, 1\]"),
    (lambda m: m.ar_generate([IDS], top_p="0.9"), r"^top_p must be a number, got str '0.9'"),
    (lambda m: m.dart_generate([IDS], max_new_token_num=2.9), r"^max_new_token_num must be an integer, got float 2.9"),
    (lambda m: m.dart_generate([IDS], max_new_token_num="3"), r"^max_new_token_num must be an integer, got str '3'"),
    (lambda m: m.ar_generate([IDS], max_new_token_num=0), r"^max_new_token_num must be an integer >= 1, got 0"),
    (lambda m: m.dart_generate([IDS], temperature="0.5"), r"^temperature must be a number, got str '0.5'"),
    (lambda m: m.dart_generate([IDS], top_k=2.5), r"^top_k must be an integer, got float 2.5"),
    (lambda m: m.dart_generate([IDS], max_new_token_num=2, remain_total=3.7),
     r"^remain_total must be an integer, got float 3.7"),
    (lambda m: m.dart_generate([IDS], max_new_token_num=2, remain_total=0),
     r"^remain_total: the draft tree size must be a positive integer"),
    (lambda m: m.encode([]), r"^the prompt is empty: pass a string, token ids or a messages list"),
    (lambda m: m.encode("hi", chat="no"), r"^chat must be True or False, got str 'no'"),
    (lambda m: m.generate("hi", enable_thinking="no"), r"^enable_thinking must be True or False, got str 'no'"),
])
def test_values_taken_the_wrong_way_are_refused(no_decoding, call, message):
    with pytest.raises(InputError, match=message):
        call(no_decoding)


@pytest.mark.parametrize("call, message", [
    # both refused over HTTP; the rule of the server and of prompt files
    (lambda m: m.generate("hi", stop=["ok", "\ud800"]), r"stop string 1 is not valid Unicode text: a lone surrogate "
                                                          r"U\+D800"),
    (lambda m: m.generate("hi", stop="\udfff"), r"stop is not valid Unicode text"),
    (lambda m: m.generate([{"role": "wizard", "content": "hi"}]), r"message 0 has role 'wizard'; use one of system, "
                                                                   r"user, assistant, tool"),
    (lambda m: m.generate([[{"role": "user", "content": "hi"}], [{"role": "wizard", "content": "hi"}]]),
     r"prompt 1 of the batch: message 0 has role 'wizard'"),
    (lambda m: m.encode([{"role": "user", "content": 5}]), r"message 0 needs string fields 'role' and 'content'"),
])
def test_stop_strings_and_roles_follow_the_servers_rule(no_decoding, call, message):
    with pytest.raises(ValueError, match=message):
        call(no_decoding)


def test_a_pool_of_a_fractional_size_is_refused(tiny):
    with pytest.raises(InputError, match=r"^slots must be an integer, got float 2.5"):
        tiny.batcher(slots=2.5)
    with pytest.raises(InputError, match=r"^max_length must be an integer, got str '64'"):
        tiny.batcher(slots=2, max_length="64")


def test_a_settings_dataclass_takes_integers_and_numbers_only():
    from dart_jax.decoding.settings import ShapeSettings

    for fields, message in ((dict(max_new_tokens=2.9), r"^max_new_tokens must be an integer, got float 2.9"),
                            (dict(seed="1"), r"^seed must be an integer, got str '1'"),
                            (dict(top_p=True), r"^top_p must be a number, got bool True")):
        with pytest.raises(InputError, match=message):
            G(**fields)
    assert G(max_new_tokens=np.int64(3), top_p=np.float32(0.5)).max_new_tokens == 3  # NumPy's numbers are numbers
    with pytest.raises(InputError, match=r"^min_bucket must be an integer >= 1, got 0"):
        ShapeSettings(min_bucket=0)


def test_one_shot_iterators_decode_as_the_same_prompts_in_a_list(tiny):
    """A generator was consumed by the batch test, then refused as empty: it decodes as its list."""
    settings = dict(max_new_tokens=3)
    assert tiny.generate(iter(IDS), **settings).token_ids == tiny.generate(IDS, **settings).token_ids
    ids = [r.token_ids for r in tiny.generate((p for p in ["hi"]), **settings)]
    assert ids == [r.token_ids for r in tiny.generate(["hi"], **settings)]
    streamed = []
    text = "".join(piece for piece, _ in tiny.stream(iter(IDS), result=streamed, **settings))
    alone = tiny.generate(IDS, **settings)
    assert text == alone.text and streamed[0].token_ids == alone.token_ids
    assert tiny.generate_many(iter([IDS]), G(**settings))[0].token_ids == tiny.generate(IDS, **settings).token_ids
    assert tiny.generate_many([], G()) == []


def test_the_reference_calls_still_take_numpy_integers_and_top_p_zero(tiny):
    plain = tiny.dart_generate([IDS], max_new_token_num=2)
    again = tiny.dart_generate(np.array([IDS]), top_p=0, max_new_token_num=np.int64(2), remain_total=np.int64(16))
    assert again.tolist() == plain.tolist() and again.shape == (1, len(IDS) + 2)


def test_a_pool_refuses_what_is_not_a_request_and_works_no_more_once_closed(tiny):
    """A closed pool has given its caches back: a second close, a submit or a step would hand out
    or write buffers that another pool holds (the oracle: the next two pools hold distinct caches)."""
    import jax

    pool = tiny.batcher(slots=1, max_length=64)
    with pytest.raises(InputError, match=r"^settings must be a GenerationSettings, got NoneType None"):
        pool.submit(IDS, None)
    with pytest.raises(InputError, match=r"^settings must be a GenerationSettings \(GenerationSettings\(\*\*d\)"):
        pool.submit(IDS, {"max_new_tokens": 2})
    with pytest.raises(InputError, match=r"^request must be a Request \(the handle that submit\(\) returned\), got "
                                         r"NoneType None"):
        pool.cancel(None)
    assert not pool.waiting
    pool.close()
    taker = tiny.batcher(slots=1, max_length=64)
    pool.close()  # gives nothing back twice
    other = tiny.batcher(slots=1, max_length=64)
    assert jax.tree.leaves(taker.state.caches())[0] is not jax.tree.leaves(other.state.caches())[0]
    for call in (lambda: pool.submit(IDS, G(max_new_tokens=2)), pool.step):
        with pytest.raises(InputError, match=r"^(submit|step)\(\) on a closed pool: close\(\) gave its caches back"):
            call()
    taker.close()
    other.close()
