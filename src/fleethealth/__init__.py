"""fleethealth: health scores and the self-healing loop for LLM GPU fleets."""

__version__ = "0.1.0"
