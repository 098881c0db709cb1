"""Small utilities the layers above the core share: a byte-bounded LRU, cancellation, JSON lines."""
