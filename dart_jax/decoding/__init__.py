"""Decoding: the speculative engine over any drafter, the autoregressive decoder, sampling and
acceptance, the host↔device transfer layout, and the settings of a generation."""
