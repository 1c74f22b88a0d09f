"""The SSRF guard of outgoing webhooks (issue 29): which addresses the service may call.

A webhook URL is an operator-given address the cluster will POST to, from inside the network.
Addresses in loopback, private (RFC 1918, unique local), link-local (which holds the cloud
metadata service, 169.254.169.254), shared (CGNAT), multicast, reserved and unspecified ranges
are refused, and so is the metadata service's IPv6 address, unless `WEBHOOK_ALLOWED_HOSTS`
names the host or a CIDR holding the address. The check runs when an endpoint is saved and
again before each attempt, on the addresses the name resolves to then (a name that resolved to
a public address when it was saved may resolve to 127.0.0.1 later: DNS rebinding); the attempt
connects to the address that was checked, never resolving again in between.
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
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return refusal(mapped, host=host)
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
