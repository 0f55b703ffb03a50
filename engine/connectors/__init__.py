"""The plugin registry: each connector or transform is one module that registers its class."""

from __future__ import annotations

from .base import Option, Plugin, validate_block

_REGISTRY: dict[tuple[str, str], type[Plugin]] = {}


def register(plugin: type[Plugin]) -> type[Plugin]:
    key = (plugin.section, plugin.name)
    if key in _REGISTRY:
        raise ValueError(f"{plugin.section} plugin {plugin.name} registered twice")
    _REGISTRY[key] = plugin
    return plugin


def get_plugin(section: str, name: str) -> type[Plugin] | None:
    _load()
    return _REGISTRY.get((section, name))


def plugin_names(section: str) -> list[str]:
    _load()
    return sorted(name for sec, name in _REGISTRY if sec == section)


def _load() -> None:
    # Importing the modules registers their plugins.
    from . import console, fake, jdbc, localfile, transforms  # noqa: F401


__all__ = ["Option", "Plugin", "get_plugin", "plugin_names", "register", "validate_block"]
