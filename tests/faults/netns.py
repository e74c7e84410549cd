"""A network namespace of the test's own, joined to the host by a veth pair, whose link
can go silent: every packet dropped both ways, no reset, no ICMP, no error to either end,
as behind a dropped NAT entry or a hung middlebox.

The pair's addresses are a /30 of 10.251.0.0/16 (or another 10.x.0.0/16 a test names, so
that tests run at once cannot collide: each file its own) chosen by the test process's
id: the host end (where the test's PostgreSQL also listens) and the namespace's end. Traffic
goes only between the two ends of the pair. The link is silenced with iptables DROP
rules inside the namespace (its INPUT from the pair and its OUTPUT to it): the host's
own rules are never touched, and deleting the namespace deletes the pair and the rules.

Needs root, ``ip`` (iproute2) and ``iptables`` that works in a namespace; `Partition.make`
skips the test, saying which is missing, without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


class Partition:
    def __init__(self, *, name: str = "part", second: int = 251) -> None:
        """``name``: the namespace's (its first letter, the pair's); ``second``: the second
        octet of the addresses. Tests that may run at once give each other's apart."""
        pid = os.getpid()
        self.ns = f"asyncq-{name}-{pid}"
        self.host_if = f"aq{name[0]}{pid % 100000}h"  # at most 15 characters
        self.ns_if = f"aq{name[0]}{pid % 100000}n"
        block = 4 * (pid % 64)
        third = 100 + (pid // 64) % 150
        self.network = f"10.{second}.{third}.{block}/30"
        self.host_ip = f"10.{second}.{third}.{block + 1}"
        self.ns_ip = f"10.{second}.{third}.{block + 2}"
        self.silent = False

    @classmethod
    def make(cls, *, name: str = "part", second: int = 251) -> Partition:
        """A namespace with its link up, or `pytest.skip` saying what is missing."""
        if os.geteuid() != 0:
            pytest.skip("a network partition needs root (ip netns, iptables)")
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                pytest.skip(f"a network partition needs {tool} (apt-get install iproute2 iptables)")
        made = cls(name=name, second=second)
        try:
            made._create()
            made._ns("iptables", "-w", "-L", "INPUT", "-n")
        except subprocess.CalledProcessError as exc:
            made.destroy()
            why = (exc.stderr or "").strip().splitlines()
            pytest.skip(f"cannot make a network namespace with iptables: {why[-1:] or exc}")
        return made

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


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
