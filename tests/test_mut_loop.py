"""Mutation-killing tests for decide/loop.py (issue 21): behaviours the decider's other tests leave open."""

from __future__ import annotations
