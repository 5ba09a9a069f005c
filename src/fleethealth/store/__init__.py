"""Persistent state of the decision loop (SQLite by default, behind ``StateStore``)."""

from fleethealth.store.base import StateStore, StoreError, open_store

__all__ = ["StateStore", "StoreError", "open_store"]
