"""Tenant-supplied URLs: parsed strictly, and matched part by part against the operator's rules.

Before issue 22 an allowlist entry was one fnmatch glob over the whole URL string, so
`http://127.0.*:8000` accepted `http://127.0.0.1:6379/x:8000` (any port of an allowed host)
and any DNS name beginning `127.0.`. A rule now names each part separately:

    scheme://HOST[:PORT][/PATH]

- HOST: an exact DNS name (`gpu-1.lab`), a subdomain wildcard (`*.lab`: names ending `.lab`),
  an address (`10.9.0.5`, `[fd00::5]`) or an address range in brackets (`[10.9.0.0/16]`);
- PORT: a number, a range `8000-8099` or `*`; omitted = the scheme's default (80 / 443);
- PATH: a prefix matched at segment boundaries (`/v1` matches `/v1` and `/v1/x`, not `/v10`).

A URL whose host is a DNS name matches an address-range rule only through what the name
resolves to, checked when the URL is submitted and again at every connection
(`agents.llm.backends.guard`), so a name cannot be pointed elsewhere later.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
NAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
_URL_RE = re.compile(
    r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>\[[^\]/]*(/\d+)?\]|[^/:\[\]]*)"
    r"(:(?P<port>[^/]*))?(?P<path>/.*)?$",
    re.I,
)
NEW_FORMAT = (
    "scheme://HOST[:PORT][/PATH], HOST an exact name, *.domain, an address or a "
    "range in brackets like [10.9.0.0/16], PORT a number, a range 8000-8099 or *"
)


@dataclass(frozen=True)
class Target:
    """A URL a tenant gave, in parts: lower-case scheme and host, the port, the path."""

    scheme: str
    host: str
    port: int
    path: str
    address: IPAddress | None  # the host when it is an address literal

    @property
    def origin(self) -> str:
        """`host:port` as a message shows it."""
        return f"{self.host}:{self.port}"


def parse_url(url: str) -> Target:
    """A base URL (http/https, host, port, path) in parts; ValueError says what is wrong.

    Strict where `urllib` is lenient: no spaces or control characters anywhere (urlsplit drops
    tabs and newlines silently), no user info, query or fragment, a valid host and port."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError("has spaces or control characters")
    match = _URL_RE.match(url)
    if not match or match["scheme"].lower() not in DEFAULT_PORTS:
        raise ValueError("must be http:// or https:// followed by a host")
    scheme, path = match["scheme"].lower(), match["path"] or ""
    if any(c in path for c in "?#@\\") or "@" in url.split("/")[2]:
        raise ValueError("must be a base URL: scheme, host, port and path only (no query, fragment or user info)")
    _check_path(path)
    host, address = _parse_host(match["host"])
    port = _parse_port(match["port"], scheme)
    return Target(scheme, host, port, path.rstrip("/"), address)


_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.I)


def _check_path(path: str) -> None:
    """Refuse a path whose meaning depends on who normalises it: a path-prefix rule matches
    the text, while httpx resolves `.`/`..` segments before sending and many servers (nginx)
    decode `%2e`/`%2f`/`%5c` first, so `/v1/%2e%2e/admin` would pass a `/v1` rule and reach
    `/admin`. Checked when a URL is submitted and again at every connection (the guard)."""
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ValueError("path must not have '.' or '..' segments")
    if _ENCODED_SEPARATOR.search(path):
        raise ValueError("path must not have percent-encoded '.', '/' or '\\' (%2e, %2f, %5c)")


def _parse_host(raw: str) -> tuple[str, IPAddress | None]:
    if raw.startswith("["):
        try:
            address = ipaddress.IPv6Address(raw[1:-1])
        except ValueError:
            raise ValueError(f"host {raw!r} is not an IPv6 address") from None
        return str(address), address
    host = raw.lower()
    try:
        address = ipaddress.IPv4Address(host)
        return str(address), address
    except ValueError:
        pass
    if not host or not NAME_RE.match(host) or len(host) > 253:
        raise ValueError(f"host {raw!r} is not a DNS name or an address")
    return host.rstrip("."), None


def _parse_port(raw: str | None, scheme: str) -> int:
    if raw is None or raw == "":
        return DEFAULT_PORTS[scheme]
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"port {raw!r} is not a number from 1 to 65535")
    return int(raw)


@dataclass(frozen=True)
class UrlRule:
    """One allowlist entry (see the module docstring for its text form)."""

    text: str
    scheme: str
    name: str | None  # an exact DNS name
    suffix: str | None  # `*.lab` -> `.lab`
    network: IPNetwork | None  # an address or an address range
    ports: tuple[int, int]
    path: str

    def allows_location(self, target: Target) -> bool:
        """Scheme, port and path match (the host is judged separately)."""
        path_ok = not self.path or target.path == self.path or target.path.startswith(self.path + "/")
        return target.scheme == self.scheme and path_ok and self.ports[0] <= target.port <= self.ports[1]

    def allows_name(self, host: str) -> bool:
        """The URL's host, as written, is this rule's name (or under its `*.` domain)."""
        return host == self.name or (self.suffix is not None and host.endswith(self.suffix))

    def allows_address(self, address: IPAddress) -> bool:
        """`address` is in this rule's range."""
        return self.network is not None and address.version == self.network.version and address in self.network


def parse_rule(text: str) -> UrlRule:
    """One allowlist entry; ValueError names the new format (old whole-URL globs included)."""
    match = _URL_RE.match(text.strip())
    scheme = match["scheme"].lower() if match else ""
    if not match or scheme not in DEFAULT_PORTS or "?" in text or "#" in text:
        raise ValueError(f"{text!r} is not a URL rule: write {NEW_FORMAT}")
    raw_host, raw_port = match["host"], match["port"]
    if (
        "*" in raw_host.lstrip("*.")
        or "*" in (match["path"] or "")
        or (raw_host.startswith("*") and not raw_host.startswith("*."))
    ):
        raise ValueError(
            f"{text!r} looks like a glob over the whole URL (the format before "
            f"issue 22, which matched any port of a host): write "
            f"{NEW_FORMAT}{_suggest(scheme, raw_host, raw_port)}"
        )
    name = suffix = network = None
    if raw_host.startswith("*."):
        suffix = _parse_host(raw_host[1:].lstrip("."))[0]
        suffix = "." + suffix
    elif raw_host.startswith("["):
        try:
            network = ipaddress.ip_network(raw_host[1:-1], strict=False)
        except ValueError:
            raise ValueError(f"{text!r}: {raw_host} is not an address range") from None
    else:
        host, address = _parse_host(raw_host)
        network = ipaddress.ip_network(address) if address else None
        name = None if address else host
    return UrlRule(
        text, scheme, name, suffix, network, _rule_ports(text, raw_port, scheme), (match["path"] or "").rstrip("/")
    )


def _rule_ports(text: str, raw: str | None, scheme: str) -> tuple[int, int]:
    if raw == "*":
        return (1, 65535)
    if raw and "-" in raw:
        low, _, high = raw.partition("-")
        ports = (_parse_port(low, scheme), _parse_port(high, scheme))
        if ports[0] > ports[1]:
            raise ValueError(f"{text!r}: port range {raw} is empty")
        return ports
    port = _parse_port(raw, scheme)
    return (port, port)


def _suggest(scheme: str, host: str, port: str | None) -> str:
    """`http://10.9.*` -> a hint `http://[10.9.0.0/16]:*` (numeric prefixes only)."""
    octets = host.rstrip("*").rstrip(".").split(".")
    if not host.endswith("*") or not all(o.isdigit() for o in octets) or len(octets) > 3:
        return ""
    cidr = ".".join(octets + ["0"] * (4 - len(octets))) + f"/{8 * len(octets)}"
    return f" (for example {scheme}://[{cidr}]:{port or '*'})"


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to now ([] when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}, key=lambda a: (a.version, a))


def address_allowed(rules: list[UrlRule], target: Target, address: IPAddress) -> bool:
    """May a connection for `target` go to `address`? (Name rules trust what a name says.)"""
    for rule in rules:
        if rule.allows_location(target) and (rule.allows_name(target.host) or rule.allows_address(address)):
            return True
    return False


def url_refusal(url: str, rules: list[UrlRule], lookup=resolve) -> str | None:
    """Why `url` is not allowed by `rules` (None when it is). A DNS name that only an address
    range could allow must resolve, and every address it resolves to must be in range."""
    try:
        target = parse_url(url)
    except ValueError as exc:
        return str(exc)
    located = [r for r in rules if r.allows_location(target)]
    if target.address is not None:
        if any(r.allows_address(target.address) for r in located):
            return None
    elif any(r.allows_name(target.host) for r in located):
        return None
    elif any(r.network is not None for r in located):
        addresses = lookup(target.host, target.port)
        if addresses and all(address_allowed(located, target, a) for a in addresses):
            return None
        if addresses:
            return f"{target.host} resolves to {', '.join(map(str, addresses))}, not allowed"
        return f"{target.host} does not resolve"
    return "no rule allows its scheme, host, port and path"
