"""Keel: a fault-tolerant data-integration engine (settings package)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
