"""Connectors and transforms: one module per plugin, each registering its class on import."""

from __future__ import annotations

from engine.connectors import console, fake, jdbc, localfile, localfile_sink, sql, transforms
from engine.connectors.base import Option, Plugin, validate_block
from engine.connectors.registry import get_plugin, plugin_names, register

#: The plugin modules, imported above for their registration.
PLUGIN_MODULES = (console, fake, jdbc, localfile, localfile_sink, sql, transforms)

__all__ = ["Option", "Plugin", "get_plugin", "plugin_names", "register", "validate_block"]
