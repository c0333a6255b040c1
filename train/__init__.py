"""Training DART draft heads with optax and orbax-checkpoint."""
