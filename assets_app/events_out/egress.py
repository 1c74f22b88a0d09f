"""The SSRF guard of outgoing webhooks (issue 29): which addresses the service may call.

A webhook URL is an operator-given address the cluster will POST to, from inside the network.
Addresses in loopback, private (RFC 1918, unique local), link-local (which holds the cloud
metadata service, 169.254.169.254), shared (CGNAT), multicast, reserved and unspecified ranges
are refused, and so is the metadata service's IPv6 address, and an IPv6 address that carries
one of those IPv4 addresses (mapped, IPv4-compatible, NAT64, 6to4, Teredo), unless
`WEBHOOK_ALLOWED_HOSTS` names the host or a CIDR holding the address. The check runs when an
endpoint is saved and again before each attempt, on the addresses the name resolves to then (a name
that resolved to a public address when it was saved may resolve to 127.0.0.1 later: DNS rebinding);
the attempt connects to the address that was checked, never resolving again in between.
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from ..guards import exceptions

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Beyond `is_global`: the metadata endpoints are named explicitly so that an allow list entry
# for a wide private range never opens them by accident (they need their own entry).
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


# IPv6 forms that carry an IPv4 address (issue 38: each passed as "global"): IPv4-compatible
# (::a.b.c.d, deprecated but routed by some stacks), NAT64's well-known prefix (RFC 6052) and
# 6to4 (RFC 3056); a local-use NAT64 prefix (RFC 8215) is refused whole. The mapped form
# (::ffff:a.b.c.d) and Teredo's client are read by `ipaddress` itself.
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, judged as the address it is."""
    found = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if (address in IPV4_COMPATIBLE and int(address) > 1) or address in NAT64_WELL_KNOWN:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


class EgressRefused(exceptions.InvalidInput):
    reason = "webhook_url_refused"


@dataclass(frozen=True)
class Target:
    """A checked URL: its scheme, host, port and the address to connect to."""

    scheme: str
    host: str
    port: int
    address: str


def _allowed() -> tuple[set[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    hosts: set[str] = set()
    networks = []
    for entry in settings.WEBHOOK_ALLOWED_HOSTS:
        entry = entry.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.lower())
    return hosts, networks


def refusal(address: IPAddress, *, host: str) -> str | None:
    """Why `address` (of `host`) may not be called, or None when it may."""
    hosts, networks = _allowed()
    if host.lower() in hosts or any(address in network for network in networks):
        return None
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL_USE:
            return f"{host} resolves to {address}, a local-use NAT64 address"
        for embedded in _embedded_ipv4(address):
            why = refusal(embedded, host=host)
            if why:
                return f"{why} (embedded in {address})"
    if not address.is_global or address.is_multicast:
        return (
            f"{host} resolves to {address}, a loopback, private, link-local or reserved "
            "address: name it in WEBHOOK_ALLOWED_HOSTS to allow it"
        )
    return None


def check_url(url: str) -> Target:
    """The URL's target after resolving its host now; EgressRefused when the scheme is not
    http(s), the host is missing or unresolvable, or any address it resolves to is refused
    (all are checked: a client may pick any of them)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EgressRefused(f"{url!r}: a webhook URL is http:// or https:// with a host")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise EgressRefused(f"{url!r}: {exc}") from exc
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EgressRefused(f"{host} does not resolve: {exc}") from exc
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for address in addresses:
        why = refusal(address, host=host)
        if why:
            raise EgressRefused(why, url=url)
    return Target(scheme=parts.scheme, host=host, port=port, address=str(addresses[0]))
