"""Test helpers shared across test packages (fakes, not production code)."""
