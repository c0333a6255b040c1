"""`python -m dart_jax.generate`: the command line of `dart_jax.api.generate` (see --help)."""
import sys

from dart_jax.api.generate import main

if __name__ == "__main__":
    sys.exit(main())
