"""JDBC URLs as SeaTunnel's configs write them, parsed without regard to the database.

A JDBC URL is ``jdbc:<subprotocol>://host[:port][,host[:port]...][/database][?k=v&...]``
(pgJDBC also takes ``jdbc:postgresql:database``; MySQL Connector/J's ``;k=v`` is not read
here). The result names the subprotocol, every host, the database and the parameters as given;
each dialect decides what its parameters mean (engine.connectors.pg_url for PostgreSQL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

#: ``jdbc:<subprotocol>:`` (``oracle:thin``, ``sqlserver``, ``mysql``): the driver family.
_PREFIX = re.compile(r"^jdbc:(?P<sub>[A-Za-z][\w.+-]*(?::[A-Za-z][\w.+-]*)*?):(?P<rest>.*)$", re.S)


#: A URL whose user:password holds an unencoded '/' or '?' (its hosts would be part of the
#: password): said without echoing any of it.
UNENCODED_USERINFO = (
    "bad host in the URL: percent-encode a user:password before '@' ('/' as %2F, '?' as %3F),"
    " or give them in the user and password options"
)


@dataclass(frozen=True)
class JdbcUrl:
    """A parsed JDBC (or libpq) URL: ``hosts`` as (host, port or ""), IPv6 without brackets."""

    subprotocol: str
    hosts: tuple[tuple[str, str], ...]
    database: str
    params: tuple[tuple[str, str], ...] = ()
    #: ``user[:password]@`` before the hosts (libpq's form): (user, password), else ("", "").
    userinfo: tuple[str, str] = ("", "")

    def param(self, name: str, default: str = "") -> str:
        """The last value given for ``name`` (a later one wins, as in pgJDBC)."""
        found = [v for k, v in self.params if k == name]
        return found[-1] if found else default


def subprotocol(url: str) -> str:
    """The URL's database family (``postgresql``, ``mysql``, ``oracle``), lower case; "" when
    it is not a URL of the JDBC form (or a libpq ``postgresql://`` one)."""
    match = _PREFIX.match(url.strip())
    if match:
        return match.group("sub").split(":")[0].lower()
    scheme, sep, _ = url.strip().partition("://")
    return scheme.lower() if sep else ""


def parse_jdbc_url(url: str) -> JdbcUrl:
    """``url`` as a JdbcUrl; ValueError (with what is wrong) when it is not of the form."""
    text = url.strip()
    match = _PREFIX.match(text)
    if match:
        sub, rest = match.group("sub").lower(), match.group("rest")
    else:
        sub, sep, rest = text.partition("://")
        if not sep:
            raise ValueError("not a JDBC URL (jdbc:<database>://host:port/database)")
        sub, rest = sub.lower(), "//" + rest
    if not rest.startswith("//"):  # jdbc:postgresql:database (the local host)
        path, _, query = rest.partition("?")
        return JdbcUrl(sub, (("localhost", ""),), unquote(path.lstrip("/")), _params(query))
    authority, _, tail = rest[2:].partition("/")
    if "?" in authority:  # jdbc:postgresql://host?k=v: no path
        authority, _, query = authority.partition("?")
        database = ""
    else:
        database, _, query = tail.partition("?")
    userinfo = ("", "")
    if "@" in authority:
        info, _, authority = authority.rpartition("@")
        user, _, password = info.partition(":")
        userinfo = (unquote(user), unquote(password))
    params = _params(query)
    if "@" in database or any("@" in key for key, _ in params):
        raise ValueError(UNENCODED_USERINFO)  # a password's '/' or '?' split the authority
    try:
        hosts = tuple(_host(h) for h in authority.split(",")) if authority else ()
    except ValueError:
        if "@" in text:  # the text may be part of a password: never shown
            raise ValueError(UNENCODED_USERINFO) from None
        raise
    return JdbcUrl(sub, hosts, unquote(database), params, userinfo)


def _host(text: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"bad IPv6 host {text!r} (write [address]:port)")
        port = rest[1:]
    elif text.count(":") > 1:
        raise ValueError(f"bad host {text!r}: write an IPv6 address in brackets ([::1]:5432)")
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ValueError(f"a host is empty in {text!r}")
    if port and not port.isdigit():
        raise ValueError(f"bad port {port!r} of host {host!r}")
    return unquote(host), port


def _params(query: str) -> tuple[tuple[str, str], ...]:
    out = []
    for part in query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        out.append((unquote(key), unquote(value)))
    return tuple(out)
