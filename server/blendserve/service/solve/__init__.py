"""``POST /solve``: a batch of questions and one budget in, voted answers out."""
