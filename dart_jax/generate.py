"""`python -m dart_jax.generate`: the command line of `dart_jax.api.generate` (see --help)."""
import sys

from dart_jax.api.options import parse_args

# answer --help and bad flags before jax, flax and the model code load (seconds)
if __name__ == "__main__":
    parse_args()

from dart_jax.api.generate import main  # noqa: E402 (after the check above, on purpose)

if __name__ == "__main__":
    sys.exit(main())
