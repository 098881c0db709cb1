"""The service under load: many clients at once, and hostile traffic (``bench.load.abuse``)."""
