"""`python -m dart_jax.generate`: the command line of `dart_jax.api.generate` (see --help)."""
import sys

from dart_jax.api.options import check_early, parse_args
from dart_jax.collector import pause, resume
from dart_jax.errors import cli_boundary

# answer --help, bad flags and missing input files before jax, flax and the model code load (seconds)
if __name__ == "__main__":
    _args = parse_args()
    _code = cli_boundary(lambda: check_early(_args), prog="dart_jax.generate")
    if _code:
        sys.exit(_code)

pause()  # the garbage collector waits while jax, flax and transformers load (dart_jax.collector)
from dart_jax.api.generate import main  # noqa: E402 (after the check above, on purpose)

resume()

if __name__ == "__main__":
    sys.exit(main())
