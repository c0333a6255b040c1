import sys

from .options import build_parser

# answer --help and bad flags before jax, flax and the model code load (seconds)
build_parser().parse_args()

from .cli import main  # noqa: E402 (after the check above, on purpose)

sys.exit(main())
