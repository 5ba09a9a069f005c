"""Persistent state of the decision loop (SQLite by default, PostgreSQL for HA, behind ``StateStore``)."""

from fleethealth.store.base import (
    StateStore,
    StoreBusy,
    StoreError,
    StoreFenced,
    StoreUnavailable,
    open_store,
)

__all__ = ["StateStore", "StoreBusy", "StoreError", "StoreFenced", "StoreUnavailable", "open_store"]
