"""blendserve's own overhead: a policy's selection, the scheduler through HTTP, answer keys."""
