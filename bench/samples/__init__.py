"""Samples a question takes to reach SC@32's error: the simulator's policies and the real
scheduler's jobs."""
