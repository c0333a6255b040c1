"""The package's layers import one way only, and imports stand at the top of files.

Read from the source with `ast` (nothing is imported), so a violation anywhere, also inside a
function, is found:
  errors                    the leaf under everything: user-error classes and the CLIs' boundary
  files                     atomic output files and folders (on errors), under every layer
  collector                 the garbage collector's pauses, under every layer (imports nothing)
  ngram, convert            leaves: nothing else of dart_jax (but errors, files)
  models                    convert
  decoding                  models, convert, ngram
  api                       decoding, models, convert, ngram
  bench                     api, decoding, models, convert, ngram
  serve                     api, decoding, models, convert, ngram
  train                     decoding, models, convert, ngram
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# top folders and what each installs as (pyproject's package-dir)
FOLDERS = {"dart_jax": "dart_jax", "ngram": "dart_jax.ngram", "convert": "dart_jax.convert", "train": "dart_jax.train"}
ALLOWED = {
    "errors": set(),
    "files": set(),
    "collector": set(),
    "ngram": set(),
    "convert": set(),
    "models": {"convert"},
    "decoding": {"models", "convert", "ngram"},
    "api": {"decoding", "models", "convert", "ngram"},
    "bench": {"api", "decoding", "models", "convert", "ngram"},
    "serve": {"api", "decoding", "models", "convert", "ngram"},
    "train": {"decoding", "models", "convert", "ngram"},
    "entry": {"api"},  # dart_jax/__init__.py and the `python -m dart_jax.generate` shim
}
for _layer in ALLOWED:
    if _layer not in ("errors", "collector"):
        ALLOWED[_layer].add("errors")
    if _layer not in ("errors", "files", "collector"):
        ALLOWED[_layer].add("files")
    if _layer != "collector":
        ALLOWED[_layer].add("collector")
# the documented API names `dart_jax.convert.load_qwen3` & co. are built in dart_jax.models; convert hands
# them on lazily, and this is the one place a lower layer may name a higher one; the package root
# hands on DartModel (and DecodeConfig with it) lazily so that importing a leaf (dart_jax.ngram) does not load jax
# likewise dart_jax.bench hands on its runners, so that `python -m dart_jax.bench` refuses a bad flag before jax loads
EXCEPTIONS = {("dart_jax.convert", "dart_jax.models.checkpoints"), ("dart_jax", "dart_jax.api.model"),
              ("dart_jax", "dart_jax.api.config"),
              ("dart_jax.bench", "dart_jax.bench.cli")}
# imports that may stay inside functions: optional or heavy, needed by few code paths
LAZY_OK = ("torch", "transformers", "matplotlib", "tokenizers", "safetensors.torch")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in ALLOWED or parts[1] == "entry":
        return "entry"
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    name = ".".join(p for p in ".".join(parts).split(".") if p)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def imports(source: str, module: str, is_package: bool):
    """(imported module, line, at top level) for every import and importlib.import_module('…')."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    # a top-level `try: import x … except ImportError:` guards an optional dependency: still the top
    for node in tree.body:
        if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id in
                                             ("ImportError", "ModuleNotFoundError") for h in node.handlers):
            top |= {id(child) for child in node.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            if node.level and not node.module:  # from . import x: x may be a module
                for alias in node.names:
                    yield f"{target}.{alias.name}", node.lineno, id(node) in top
            else:
                yield target, node.lineno, id(node) in top
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.args[0].value, node.lineno, False


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    found = []
    mine = layer_of(module)
    for target, line, at_top in imports(source, module, is_package):
        if target.startswith("dart_jax.") and (module, target) not in EXCEPTIONS:
            theirs = layer_of(target)
            if theirs != mine and theirs not in ALLOWED[mine] and theirs != "entry":
                found.append(f"{module}:{line} ({mine}) imports {target} ({theirs})")
            if theirs == "entry" and target != "dart_jax" and mine != "entry":
                found.append(f"{module}:{line} ({mine}) imports {target} (an entry point)")
        if not at_top and (module, target) not in EXCEPTIONS and not target.startswith(LAZY_OK):
            found.append(f"{module}:{line} imports {target} inside a function or block; move it to the top")
    return found


def package_files():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path


def test_layers_import_one_way_and_at_the_top():
    found = []
    for path in package_files():
        found += violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, "\n".join(found)


def test_the_check_catches_upward_and_hidden_imports():
    # a leaf reaching up, a lazy import of our own code, and a relative import that climbs a layer
    assert violations("from dart_jax.models.qwen3 import Qwen3\n", "dart_jax.convert.qwen3")
    assert violations("def f():\n    from dart_jax.ngram import Trie\n", "dart_jax.decoding.engine")
    assert violations("from ..api.model import DartModel\n", "dart_jax.models.head")
    assert violations("import importlib\nimportlib.import_module('dart_jax.train.loop')\n", "dart_jax.bench.cli")
    assert not violations("from ..models.head import DartHead\n", "dart_jax.decoding.drafter")
    assert not violations("from dart_jax.files import atomic_path\n", "dart_jax.ngram.trie")  # under ngram
    assert violations("from dart_jax.ngram import Trie\n", "dart_jax.files")  # but nothing above errors
    guarded = "try:\n    import fastapi\nexcept ImportError:\n    fastapi = None\n"
    assert not violations(guarded, "dart_jax.serve.app")
    assert violations(guarded.replace("ImportError", "ValueError"), "dart_jax.serve.app")
    assert module_name(ROOT / "convert" / "qwen3.py") == "dart_jax.convert.qwen3"
    assert module_name(ROOT / "dart_jax" / "models" / "__init__.py") == "dart_jax.models"
