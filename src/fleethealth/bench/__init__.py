"""Benchmarks that operators run to size their own controller (`fleethealth bench ...`)."""
