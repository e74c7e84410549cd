"""A network namespace of the test's own, joined to the host by a veth pair, whose link
can go silent: every packet dropped both ways, no reset, no ICMP, no error to either end,
as behind a dropped NAT entry or a hung middlebox.

The pair's addresses are a /30 of 10.251.0.0/16 chosen by the test process's id: the
host end (where the test's PostgreSQL also listens) and the namespace's end. Traffic
goes only between the two ends of the pair. The link is silenced with iptables DROP
rules inside the namespace (its INPUT from the pair and its OUTPUT to it): the host's
own rules are never touched, and deleting the namespace deletes the pair and the rules.

`Fleet` makes several such namespaces at once, one host each, in 10.253.0.0/16 (the
fleet test). Needs root, ``ip`` (iproute2) and ``iptables`` that works in a namespace;
`Partition.make` and `Fleet.make` skip the test, saying which is missing, without them.
"""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
import subprocess

import pytest


class Partition:
    """One namespace and its pair. Without arguments: the partition test's, a /30 of
    10.251.0.0/16 named by the process id; `Fleet` makes several with names and a
    subnet of its own."""

    def __init__(
        self, *, ns: str | None = None, ifname: str | None = None, network: str | None = None
    ) -> None:
        pid = os.getpid()
        if network is None:
            block = 4 * (pid % 64)
            third = 100 + (pid // 64) % 150
            network = f"10.251.{third}.{block}/30"
        net = ipaddress.ip_network(network)
        assert net.prefixlen == 30, network
        self.ns = ns or f"asyncq-part-{pid}"
        ifname = ifname or f"aqp{pid % 100000}"
        assert len(ifname) <= 14, ifname  # with the h or n, at most 15 characters
        self.host_if = f"{ifname}h"
        self.ns_if = f"{ifname}n"
        self.network = str(net)
        self.host_ip = str(net[1])
        self.ns_ip = str(net[2])
        self.silent = False

    @classmethod
    def make(cls, *, name: str = "part", second: int = 251) -> Partition:
        """A namespace with its link up, or `pytest.skip` saying what is missing.
        ``name``: the namespace's (its first letter, the pair's); ``second``: the second
        octet of the addresses. Tests that may run at once give each other's apart."""
        require_tools()
        pid = os.getpid()
        block = 4 * (pid % 64)
        third = 100 + (pid // 64) % 150
        made = cls(
            ns=f"asyncq-{name}-{pid}",
            ifname=f"aq{name[0]}{pid % 100000}",
            network=f"10.{second}.{third}.{block}/30",
        )
        made.create_or_skip()
        return made

    def create_or_skip(self) -> None:
        """Create the namespace and its pair, or delete what was made and skip."""
        try:
            self._create()
            self._ns("iptables", "-w", "-L", "INPUT", "-n")
        except subprocess.CalledProcessError as exc:
            self.destroy()
            why = (exc.stderr or "").strip().splitlines()
            pytest.skip(f"cannot make a network namespace with iptables: {why[-1:] or exc}")

    def prefix(self) -> list[str]:
        """Run a command inside the namespace: ``[*prefix(), command, ...]``."""
        return ["ip", "netns", "exec", self.ns]

    def silence(self) -> None:
        """Drop every packet on the link, both ways, from now on."""
        self._ns("iptables", "-w", "-A", "INPUT", "-i", self.ns_if, "-j", "DROP")
        self._ns("iptables", "-w", "-A", "OUTPUT", "-o", self.ns_if, "-j", "DROP")
        self.silent = True

    def restore(self) -> None:
        self._ns("iptables", "-w", "-F")
        self.silent = False

    def destroy(self) -> None:
        """Delete the namespace, with the pair and the rules."""
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)

    def _create(self) -> None:
        self.destroy()  # a namespace left by an earlier run of this process id
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _run("ip", "link", "set", self.ns_if, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        self._ns("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self._ns("ip", "link", "set", self.ns_if, "up")
        self._ns("ip", "link", "set", "lo", "up")

    def _ns(self, *command: str) -> None:
        _run(*self.prefix(), *command)


class Fleet:
    """``n`` namespaces, each joined to the host by a pair of its own: a fleet of hosts.

    Namespace ``i`` is ``<name>-<pid>-<i>``; its pair gets the ``i``-th /30 of a block of
    10.253.0.0/16 (by default) chosen by the test process's id, so that tests of other
    processes, and the partition test's 10.251.0.0/16, never collide with it. `network`
    is the whole block (the server trusts it); each link can be silenced on its own.
    """

    def __init__(self, n: int, *, name: str = "asyncq-fleet", subnet: str = "10.253") -> None:
        pid = os.getpid()
        size = 4 * 2 ** math.ceil(math.log2(max(n, 1)))  # addresses: a /30 per namespace
        blocks = 65536 // size
        start = (pid % blocks) * size
        base = ipaddress.ip_address(f"{subnet}.0.0") + start
        self.network = str(ipaddress.ip_network(f"{base}/{32 - int(math.log2(size))}"))
        self.links = [
            Partition(
                ns=f"{name}-{pid}-{i}",
                ifname=f"aqf{pid % 100000}-{i}",
                network=f"{base + 4 * i}/30",
            )
            for i in range(n)
        ]

    @classmethod
    def make(cls, n: int, **options: str) -> Fleet:
        """``n`` namespaces with their links up, or `pytest.skip` saying what is missing."""
        require_tools()
        made = cls(n, **options)
        try:
            for link in made.links:
                link.create_or_skip()
        except BaseException:
            made.destroy()
            raise
        return made

    @property
    def host_ips(self) -> list[str]:
        return [link.host_ip for link in self.links]

    def destroy(self) -> None:
        for link in self.links:
            link.destroy()


def require_tools() -> None:
    """`pytest.skip`, saying which, without root, ``ip`` or ``iptables``."""
    if os.geteuid() != 0:
        pytest.skip("a network partition needs root (ip netns, iptables)")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            pytest.skip(f"a network partition needs {tool} (apt-get install iproute2 iptables)")


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
