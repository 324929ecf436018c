"""Network namespaces for partition tests (issue 19 §3): a service runs in a namespace of its
own, reached over veth pairs whose links the test cuts, heals or slows.

Only what the test creates is ever touched: namespaces named ``al-<tag>``, their veth pairs,
addresses in ``10.213.0.0/16`` and service addresses on the host's loopback labelled ``lo:al``.

A cut is silent, as a partition is: the ``blackhole`` qdisc on a veth end drops every packet
leaving it, with no RST and no ICMP (what ``netem loss 100%`` does; this box's kernel has no
``sch_netem``, so the cut does not depend on it). ``delay`` needs ``sch_netem``.

Run as root (``ip netns`` and ``tc``).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

PREFIX = "al-"
# Host-side service addresses (see ``ServiceAddress``) live on the loopback under this label.
LABEL = "lo:al"
# Every link of every namespace takes a /30 of this block.
BLOCK = ipaddress.ip_network("10.213.0.0/17")
# Service addresses: a /32 each, outside the links' block.
SERVICE_BLOCK = ipaddress.ip_network("10.213.255.0/24")


class NetemMissing(RuntimeError):
    """The kernel has no ``sch_netem``: delays and partial loss cannot be emulated here."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = sh("ip", "-4", "-o", "addr", "show").stdout
    return [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", out)]


def _free_subnet(taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    for subnet in BLOCK.subnets(new_prefix=30):
        if not any(subnet.overlaps(n) for n in taken):
            return subnet
    raise RuntimeError(f"no free /30 left in {BLOCK}")


def clean_stale() -> list[str]:
    """Delete what a crashed earlier run left: ``al-*`` namespaces no process runs in (their
    veth pairs go with them), and service addresses no namespace can use any more."""
    removed = []
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not sh("ip", "netns", "pids", name, check=False).stdout.strip():
            sh("ip", "netns", "delete", name, check=False)
            removed.append(name)
    live = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines()
            if line.startswith(PREFIX)]
    if not live:
        for address in ServiceAddress.existing():
            sh("ip", "addr", "del", f"{address}/32", "dev", "lo", check=False)
            removed.append(address)
    return removed


class ServiceAddress:
    """An address of the host on its loopback (``10.213.255.x/32``): a service bound to it is
    reachable from every namespace (each routes to the host over its own link) and from the
    host. Cutting a namespace's link cuts that namespace only."""

    def __init__(self) -> None:
        taken = set(self.existing())
        free = next(str(a) for a in SERVICE_BLOCK.hosts() if str(a) not in taken)
        sh("ip", "addr", "add", f"{free}/32", "dev", "lo", "label", LABEL)
        self.ip = free

    @staticmethod
    def existing() -> list[str]:
        out = sh("ip", "-4", "-o", "addr", "show", "dev", "lo").stdout
        return [m for m in re.findall(r"inet (\S+)/32 .*" + re.escape(LABEL), out)]

    def close(self) -> None:
        sh("ip", "addr", "del", f"{self.ip}/32", "dev", "lo", check=False)

    def __enter__(self) -> ServiceAddress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Link:
    """One veth pair between the host and the namespace."""

    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str


class Namespace:
    """A namespace ``al-<tag>`` with a veth link ``main`` (its default route to the host) and
    any ``extra`` links; ``route`` sends one host address over an extra link, so a cut of one
    link leaves the paths over the others up (no iptables needed).

    A context manager: everything is created on entry and deleted on exit, even after a
    failure (deleting the namespace deletes its veth pairs)."""

    def __init__(self, tag: str, *, extra: Sequence[str] = ()) -> None:
        if len(tag) > 8 or not re.fullmatch(r"[a-z0-9]+", tag):
            raise ValueError("a tag is 1-8 lowercase letters or digits (interface names are short)")
        self.tag = tag
        self.name = f"{PREFIX}{tag}"
        self._names = ["main", *extra]
        self.links: dict[str, Link] = {}

    @property
    def host_ip(self) -> str:
        return self.links["main"].host_ip

    @property
    def ns_ip(self) -> str:
        return self.links["main"].ns_ip

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def _ns(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(*self.argv(list(argv)), check=check)

    def __enter__(self) -> Namespace:
        sh("ip", "netns", "delete", self.name, check=False)  # ours, from a crashed run
        sh("ip", "netns", "add", self.name)
        try:
            self._ns("ip", "link", "set", "lo", "up")
            taken = _used_networks()
            for i, link_name in enumerate(self._names):
                subnet = _free_subnet(taken)
                taken.append(subnet)
                host_ip, ns_ip = (str(a) for a in list(subnet.hosts())[:2])
                link = Link(f"{self.name}-h{i}", f"{self.name}-n{i}", host_ip, ns_ip)
                sh("ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if,
                   "netns", self.name)
                sh("ip", "addr", "add", f"{host_ip}/30", "dev", link.host_if)
                sh("ip", "link", "set", link.host_if, "up")
                self._ns("ip", "addr", "add", f"{ns_ip}/30", "dev", link.ns_if)
                self._ns("ip", "link", "set", link.ns_if, "up")
                self.links[link_name] = link
            self._ns("ip", "route", "add", "default", "via", self.host_ip)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        sh("ip", "netns", "delete", self.name, check=False)
        for link in self.links.values():  # gone with the namespace; a leftover is removed
            sh("ip", "link", "delete", link.host_if, check=False)

    def route(self, address: str, link: str) -> None:
        """Reach the host's ``address`` (a ``ServiceAddress``) over ``link``."""
        self._ns("ip", "route", "replace", f"{address}/32", "via", self.links[link].host_ip)

    def cut(self, link: str = "main", *, inbound: bool = True, outbound: bool = True) -> None:
        """Silently drop everything on ``link`` (both directions by default). ``outbound`` is
        what the namespace sends, ``inbound`` what it receives: a one-way cut of ``outbound``
        lets requests in and holds every answer (TCP retransmits it after the heal)."""
        ends = self.links[link]
        if inbound:
            sh("tc", "qdisc", "replace", "dev", ends.host_if, "root", "blackhole")
        if outbound:
            self._ns("tc", "qdisc", "replace", "dev", ends.ns_if, "root", "blackhole")

    def heal(self, link: str = "main") -> None:
        """Back to a clean link (any cut or delay removed)."""
        ends = self.links[link]
        sh("tc", "qdisc", "del", "dev", ends.host_if, "root", check=False)
        self._ns("tc", "qdisc", "del", "dev", ends.ns_if, "root", check=False)

    def delay(self, ms: int, jitter_ms: int = 0, loss_pct: float = 0, link: str = "main") -> None:
        """``ms`` (± ``jitter_ms``) on each direction of ``link`` and ``loss_pct`` % loss.

        Raises:
            NetemMissing: The kernel has no ``sch_netem``.
        """
        ends = self.links[link]
        spec = ["netem", "delay", f"{ms}ms", f"{jitter_ms}ms", "loss", f"{loss_pct}%"]
        for argv in (["tc", "qdisc", "replace", "dev", ends.host_if, "root", *spec],
                     self.argv(["tc", "qdisc", "replace", "dev", ends.ns_if, "root", *spec])):
            result = sh(*argv, check=False)
            if "unknown" in result.stderr.lower():
                raise NetemMissing(result.stderr.strip())
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")

    def dropped(self, link: str = "main") -> int:
        """Packets the link's qdiscs dropped so far (both ends): proof that a cut struck
        traffic, not an idle link."""
        ends = self.links[link]
        total = 0
        for out in (sh("tc", "-s", "qdisc", "show", "dev", ends.host_if).stdout,
                    self._ns("tc", "-s", "qdisc", "show", "dev", ends.ns_if).stdout):
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
        return total


def netem_available() -> bool:
    """Whether the kernel emulates delay and loss (``sch_netem``)."""
    with Namespace("probe") as ns:
        try:
            ns.delay(1)
        except NetemMissing:
            return False
    return True
