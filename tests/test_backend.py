"""The backend defaults (dart_jax/models/backend.py): what each backend gets, that every option
overrides them, that the accelerators' defaults (the device loop over a 60-node tree, fused
projections) decode greedily as plain decoding and transformers do (run here on the CPU with the
backend faked), and `python -m dart_jax.generate --device-info`."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import torch

from dart_jax.api.model import DartModel
from dart_jax.api.generate import load_model
from dart_jax.api.options import parse_args
from dart_jax.bench.tiny import make_tiny_setup
from dart_jax.decoding import ahead
from dart_jax.decoding.driver import decode as driver_decode
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError
from dart_jax.models import backend
from dart_jax.ngram import Trie

EOS = 2
PROMPTS = [[5, 9, 14, 3, 27], list(range(3, 20))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("backend")
    base, head, _ = make_tiny_setup(folder, vocab_size=32, draft_length=3, shuffle_d2t=True, num_hidden_layers=4,
                                    seed=2)
    hf = Qwen3ForCausalLM.from_pretrained(base, dtype=torch.float32).eval()

    def greedy(prompt, n, eos=EOS):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              eos_token_id=eos, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    # a trie of the target's own greedy continuations: long accepted runs, several steps a device call
    trie = folder / "cheating.trie"
    Trie.build([p + greedy(p, 40, eos=None) for p in PROMPTS], order=3).save(trie)
    return base, head, trie, greedy


def fake_backend(monkeypatch, name):
    monkeypatch.setattr(backend, "current_backend", lambda: name)


@pytest.mark.parametrize("name", ["gpu", "tpu"])
def test_accelerators_default_to_the_device_loop_over_the_reference_tree(monkeypatch, name):
    fake_backend(monkeypatch, name)
    got = backend.defaults_for()
    assert (got.backend, got.device_steps, got.keep, got.fused_projections, got.verify_gemms, got.attention,
            got.untied_lm_head) == (name, 32, 60, True, "auto", "xla", False)


def test_a_cpu_keeps_the_host_loop_and_its_layout(monkeypatch):
    fake_backend(monkeypatch, "cpu")
    got = backend.defaults_for()
    assert (got.device_steps, got.keep, got.fused_projections, got.verify_gemms, got.attention,
            got.untied_lm_head) == (0, "auto", False, "auto", "xla", True)
    assert backend.defaults_for("gpu").device_steps == 32  # an explicit backend is not the current one
    assert got.override(keep=7, device_steps=None).keep == 7 and got.override(device_steps=None).device_steps == 0
    with pytest.raises(InputError, match="unknown backend option.*'keeps'"):
        got.override(keeps=7)


def decode(engine, prompt, n, ar=False):
    stats = Stats()
    settings = GenerationSettings(max_new_tokens=n)
    ids, counts = [], []
    for event in driver_decode(engine, prompt, settings, stats, plain=ar):
        ids += event.ids
        counts.append(event.accepted)
    return ids, counts


@pytest.mark.extended
def test_gpu_defaults_decode_greedily_as_plain_decoding(tiny, monkeypatch):
    """from_pretrained on a (faked) GPU without backend options: the device loop of 32 steps a call
    over a fixed 60-node tree with fused projections; its greedy tokens are plain decoding's and
    transformers'."""
    base, head, trie, greedy = tiny
    fake_backend(monkeypatch, "gpu")
    model = DartModel.from_pretrained(base, head, trie, min_bucket=64)
    engine = model.engine
    assert (engine.device_steps, engine.tree.keep, engine.adaptive) == (32, 60, False)
    assert model.target.fused_projections and model.target.lm_head is None
    for prompt in PROMPTS:
        dart, counts = decode(engine, prompt, 24)
        ar, _ = decode(engine, prompt, 24, ar=True)
        assert dart == ar == greedy(prompt, 24)
        assert max(counts) > 2  # runs of accepted draft tokens, several steps in one device call


def test_options_override_the_backend_defaults(tiny, monkeypatch):
    """On a (faked) GPU every option given wins; keep="auto" or a mesh turn the device loop's default
    off (it needs one fixed tree size on one device)."""
    base, head, trie, greedy = tiny
    fake_backend(monkeypatch, "gpu")
    model = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=8, device_steps=0,
                                      fused_projections=False, untied_lm_head=True, verify_gemms="xla")
    engine = model.engine
    assert (engine.device_steps, engine.tree.keep, engine.verify_gemms) == (0, 8, "xla")
    assert not model.target.fused_projections and model.target.lm_head is not None
    dart, _ = decode(engine, PROMPTS[0], 12)
    assert dart == greedy(PROMPTS[0], 12)
    auto = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep="auto", fused_projections=False)
    assert auto.engine.adaptive and auto.engine.device_steps == 0
    mesh = DartModel.from_pretrained(base, head, trie, min_bucket=64, mesh="model=1")
    assert mesh.engine.device_steps == 0 and not mesh.target.fused_projections
    with pytest.raises(InputError, match="fused_projections .* one device"):
        DartModel.from_pretrained(base, head, trie, mesh="model=1", fused_projections=True)
    with pytest.raises(InputError, match="device_steps.*not \"auto\""):
        DartModel.from_pretrained(base, head, trie, keep="auto", device_steps=4)


def test_the_cli_leaves_unset_options_to_the_backend(monkeypatch):
    """generate's flags reach from_pretrained only where given (else None: the backend's default),
    and the SmolLM2 demo chooses its tree size up to 7 nodes (keep "auto") on a CPU only."""
    asked = []
    monkeypatch.setattr(DartModel, "from_pretrained", lambda *a, **kw: asked.append(kw))
    fake_backend(monkeypatch, "cpu")
    load_model(parse_args(["--no-compile-cache"]))
    load_model(parse_args(["--no-compile-cache", "--demo", "tiny"]))
    load_model(parse_args(["--no-compile-cache", "--fused-projections", "off", "--device-steps", "0",
                           "--keep", "12", "--verify-gemms", "xla", "--attention", "xla"]))
    fake_backend(monkeypatch, "gpu")
    load_model(parse_args(["--no-compile-cache"]))
    # each call's settings: its DecodeConfig's fields that were set (None: left to the backend)
    smollm2_cpu, tiny_cpu, given, smollm2_gpu = (
        {k: v for k, v in dataclasses.asdict(kw["config"]).items() if v is not None} for kw in asked)
    assert (smollm2_cpu["keep"], smollm2_cpu["max_keep"]) == ("auto", 7) and "device_steps" not in smollm2_cpu
    assert "fused_projections" not in smollm2_cpu and smollm2_cpu["eagle3_total_token"] == 8
    assert not {"keep", "device_steps", "verify_gemms", "attention"} & set(tiny_cpu)
    assert (given["keep"], given["device_steps"], given["fused_projections"], given["verify_gemms"],
            given["attention"]) == (12, 0, False, "xla", "xla")
    assert not {"keep", "max_keep", "device_steps", "eagle3_total_token"} & set(smollm2_gpu), smollm2_gpu


def test_device_info_prints_the_backend_its_devices_and_its_defaults():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=3")
    done = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--device-info"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "backend: cpu"
    assert lines[1] == "devices: 3 x cpu"
    assert [line.split(":")[0].strip() for line in lines[2:5]] == ["0", "1", "2"]
    assert all("memory" in line for line in lines[2:5])
    defaults = dict(line.strip().split(": ", 1) for line in lines[6:])
    assert defaults["device_steps"].startswith("0 ") and defaults["keep"].startswith("auto")
    assert defaults["fused_projections"].startswith("False") and defaults["untied_lm_head"].startswith("True")
    assert "--fused-projections" in defaults["fused_projections"]


def test_help_shows_each_backend_options_default():
    done = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--help"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, COLUMNS="2000"))
    assert done.returncode == 0
    entries, entry = {}, None  # each option's entry: its first line "  --flag ..." and the help lines below it
    for line in done.stdout.splitlines():
        if line.startswith("  -"):
            entry = line.split()[0]
            entries[entry] = ""
        if entry is not None:
            entries[entry] += " " + line.strip()
    for flag, default in (("--keep", "(default: the backend's"), ("--device-steps", "(default: the backend's"),
                          ("--verify-gemms", "(default: the backend's, auto)"),
                          ("--attention", "(default: the backend's, xla)"), ("--fused-projections", "(default: auto)")):
        assert default in entries[flag], entries[flag]


def test_the_light_flag_choices_are_the_librarys():
    """The CLI declares --attention and --verify-gemms once (api.options.add_backend_flags, for
    generate, serve and bench) with choices it cannot import from the models (jax): they must be
    the library's own lists."""
    from dart_jax.api.options import ATTENTION_CHOICES, VERIFY_GEMMS_CHOICES
    from dart_jax.models.qwen3 import ATTENTION_KERNELS, VERIFY_GEMMS

    assert ATTENTION_CHOICES == ATTENTION_KERNELS and VERIFY_GEMMS_CHOICES == VERIFY_GEMMS


def test_a_cpu_compiles_the_decoding_programs_without_ynnpack_fusions(tiny):
    """On a CPU each decoding program compiles with YNNPACK's fusions off
    (`backend.program_compiler_options`). The oracle is XLA's compiled text: the same XLA hands a
    product of a few rows to YNNPACK by default (a `__ynn_fusion`), and none of DART's and plain
    decoding's programs holds one; greedy DART still decodes as transformers does."""
    rows = jax.ShapeDtypeStruct((8, 64), jnp.float32), jax.ShapeDtypeStruct((64, 64), jnp.float32)
    assert "__ynn_fusion" in jax.jit(lambda a, b: a @ b).lower(*rows).compile().as_text()
    base, head, trie, greedy = tiny
    # a tree size no other test compiles (test_generate_cli and test_api_usability trace theirs anew)
    model = DartModel.from_pretrained(base, head, trie, keep=13)
    texts = {}
    for plain in (False, True):
        pool = model.engine.batcher(1, 128, plain=plain)
        for program in ahead.programs(pool, 1, 20, 60):
            if program.kind != "search":
                texts[program.kind] = program.compile().as_text()
        pool.close()
    assert set(texts) == {"prefill", "step", "ar prefill", "ar chunk"}
    assert not [kind for kind, text in texts.items() if "__ynn_fusion" in text]
    assert model.generate(PROMPTS[1], max_new_tokens=12, chat=False).token_ids == greedy(PROMPTS[1], 12)
