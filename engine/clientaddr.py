"""The caller's address, from forwarded headers only where a trusted proxy wrote them.

The web process sees its TCP peer (``REMOTE_ADDR``). Any caller can send ``X-Forwarded-For``,
so it is believed only hop by hop from the right: while the address at hand is one of the
proxies in ``KEEL_TRUSTED_PROXIES`` (settings.TRUSTED_PROXIES), the entry that proxy appended
names the next hop; the first address that is not a trusted proxy is the client. A spoofed
entry left of it is never reached. Everything that asks who the caller is (django-axes' login
lockout, ``/metrics``' loopback rule) asks here, and the middleware puts the answer in
``REMOTE_ADDR`` for the rest.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_RESOLVED = "keel.client_address"
_PEER = "keel.peer_address"


def parse(text: str) -> Address | None:
    """An address as proxies write it (``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``, an
    IPv4-mapped IPv6 address as its IPv4 form); None for anything else."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def trusted(address: Address, proxies: Iterable[Network]) -> bool:
    return any(address in network for network in proxies)


def resolve(peer: str, forwarded_for: str, proxies: Iterable[Network]) -> str:
    """The client behind ``peer``: ``forwarded_for`` walked right to left while the hop at hand
    is a trusted proxy. A trusted proxy that wrote no address stops the walk at that proxy."""
    proxies = tuple(proxies)
    current = parse(peer)
    if current is None:
        return peer
    hops = forwarded_for.split(",") if forwarded_for else []
    while hops and trusted(current, proxies):
        hop = parse(hops.pop())
        if hop is None:
            break
        current = hop
    return str(current)


def client_address(request: HttpRequest) -> str:
    """The caller's address for this request (resolved once; axes' AXES_CLIENT_IP_CALLABLE)."""
    meta = request.META
    if _RESOLVED not in meta:
        meta[_PEER] = meta.get("REMOTE_ADDR", "")
        meta[_RESOLVED] = resolve(
            meta[_PEER], meta.get("HTTP_X_FORWARDED_FOR", ""), settings.TRUSTED_PROXIES
        )
    return meta[_RESOLVED]


def peer_is_trusted(request: HttpRequest) -> bool:
    client_address(request)
    peer = parse(request.META[_PEER])
    return peer is not None and trusted(peer, settings.TRUSTED_PROXIES)


class ForwardedHeadersMiddleware:
    """First in the stack: ``REMOTE_ADDR`` becomes the resolved client, and
    ``X-Forwarded-Proto`` (which ``SECURE_PROXY_SSL_HEADER`` reads in production) is dropped
    unless a trusted proxy sent it. Sync and async alike, so it costs ASGI no thread hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        address = client_address(request)
        if not peer_is_trusted(request):
            request.META.pop("HTTP_X_FORWARDED_PROTO", None)
        request.META["REMOTE_ADDR"] = address
        return self.get_response(request)
