"""Which addresses a receiver may reach: public ones, and those an admin's allow-list names.

A webhook URL is typed by people with the admin role, but the request is made from inside the
deployment, so an unchecked URL reads loopback services, the cloud metadata endpoint or anything
on the private network (server-side request forgery). `TargetPolicy` refuses every address that
is not globally routable unless `FLIGHTDECK_RECEIVER_ALLOW` names it. The URL is checked when a
receiver is saved (`check_url`: literal addresses and local names, no DNS) and again at every send
on the addresses the name resolves to (`resolve`); the sender connects to exactly those checked
addresses, so a name that re-resolves elsewhere between check and connect (DNS rebinding) gains
nothing.

Example::

    policy = TargetPolicy.parse("127.0.0.1, 10.20.0.0/16, alertmanager.internal")
    addresses = policy.resolve("hooks.slack.com", 443)   # TargetRefused when not allowed
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The instance metadata services of AWS, GCP, Azure, OpenStack and others (and AWS's IPv6 one).
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"})
ALLOW_SETTING = "FLIGHTDECK_RECEIVER_ALLOW"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)


class TargetRefused(ValueError):
    """A receiver's destination is not a public address and the allow-list does not name it."""


def address_kind(address: Address) -> str | None:
    """Say why `address` is internal (loopback, link-local, cloud metadata, private, ...), or None when public."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 reaches 127.0.0.1
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "non-global"  # shared address space (100.64/10), reserved, documentation ranges
    return None


def _literal_address(host: str) -> Address | None:
    """Read `host` as an IP address, including the legacy IPv4 forms resolvers accept (127.1, 0x7f.1, 2130706433)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fA-FxX.]+", host):  # inet_aton takes only numbers: "cafe.be" stays a name
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _normal_name(host: str) -> str:
    return host.strip().rstrip(".").lower()


@dataclass(frozen=True)
class TargetPolicy:
    """The allow-list: networks (an address or CIDR) and host names a receiver may reach although internal."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> TargetPolicy:
        """Read a comma- or space-separated allow-list of addresses, CIDR networks and host names."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for entry in re.split(r"[,\s]+", text.strip()):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _normal_name(entry)
            if not _HOSTNAME.match(name) or name.replace(".", "").isdigit():
                raise ValueError(f"{entry!r} is neither an address, a CIDR network nor a host name")
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def refusal(self, host: str, address: Address) -> str | None:
        """Say why `address` (which `host` resolved to) may not be reached ("a loopback address"), or None."""
        kind = address_kind(address)
        if kind is None or _normal_name(host) in self.hosts:
            return None
        plain = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped else address
        if any(plain in network for network in self.networks if network.version == plain.version):
            return None
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address"

    def check_url(self, url: str) -> None:
        """Refuse a URL whose host is an internal literal address or a local name; names are resolved at send time."""
        host = urlsplit(url).hostname or ""
        name = _normal_name(host)
        if name in self.hosts:
            return
        if name == "localhost" or name.endswith(".localhost") or name in METADATA_NAMES:
            kind = "cloud metadata" if name in METADATA_NAMES else "loopback"
            raise TargetRefused(f"the host {name} is a {kind} name; {ALLOW_SETTING} must name it to allow it")
        address = _literal_address(host)
        why = None if address is None else self.refusal(host, address)
        if why:
            raise TargetRefused(f"the host {host} is {why}; {ALLOW_SETTING} must name it to allow it")

    def resolve(self, host: str, port: int) -> list[tuple[int, tuple]]:
        """Resolve `host` once and return (family, sockaddr) pairs to connect to; refused if any is not allowed.

        NOTE: every answer is checked, not just the first: a name that mixes a public and an
        internal address would otherwise reach the internal one on a retry or a fallback.
        """
        self.check_url(f"//{host}" if ":" not in host else f"//[{host}]")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except UnicodeError:
            raise socket.gaierror(socket.EAI_NONAME, "the host name cannot be encoded") from None
        resolved = []
        for family, _type, _proto, _canon, sockaddr in infos:
            address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
            why = self.refusal(host, address)
            if why:
                raise TargetRefused(f"the host resolves to {why}; {ALLOW_SETTING} must name it to allow it")
            resolved.append((family, sockaddr))
        return resolved


PUBLIC_ONLY = TargetPolicy()
