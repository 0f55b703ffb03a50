"""The plugin registry: each connector or transform module registers its class when imported
(engine.connectors imports them all). Names match without regard to case, as SeaTunnel's do:
``jdbc { }`` is ``Jdbc { }``."""

from __future__ import annotations

from engine.connectors.base import Plugin

_REGISTRY: dict[tuple[str, str], type[Plugin]] = {}


def register(plugin: type[Plugin]) -> type[Plugin]:
    key = (plugin.section, plugin.name.lower())
    if key in _REGISTRY:
        raise ValueError(f"{plugin.section} plugin {plugin.name} registered twice")
    _REGISTRY[key] = plugin
    return plugin


def get_plugin(section: str, name: str) -> type[Plugin] | None:
    return _REGISTRY.get((section, name.lower()))


def plugin_names(section: str) -> list[str]:
    return sorted(plugin.name for (sec, _), plugin in _REGISTRY.items() if sec == section)
