"""The networks: the Qwen3 target, the DART draft head, their shared layers, sharding rules, and
building them from checkpoints (`checkpoints`)."""
