"""The node's network: a bridge on this machine and one network namespace per pod, as a CNI bridge
plugin would make them. Pods get addresses from the bridge's /24 and reach each other, the machine
and the API server through it; no route leads out of the machine. Needs root and ``ip``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import subprocess
from pathlib import Path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


@dataclasses.dataclass(frozen=True)
class Bridge:
    """``name`` carries the first address of ``subnet``; pods take the others."""

    name: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def create(self) -> None:
        self.delete()
        # A fixed address: a bridge otherwise takes the lowest of its ports' and changes it as pods
        # come and go, and the pods' ARP entries for the gateway then point nowhere.
        ip("link", "add", self.name, "address", "02:d7:00:00:00:01", "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")

    def delete(self) -> None:
        ip("link", "del", self.name, check=False)

    def pod_address(self, index: int) -> str:
        """The ``index``-th pod's address (1-based), after the gateway's."""
        address = self.subnet.network_address + 1 + index
        if address not in self.subnet or address == self.subnet.broadcast_address:
            raise RuntimeError(f"no address left in {self.subnet}")
        return str(address)


@dataclasses.dataclass(frozen=True)
class PodNetwork:
    """One pod's namespace ``namespace``, its ``eth0`` at ``address``, the host end on the bridge."""

    namespace: str
    address: str
    bridge: Bridge

    @property
    def host_end(self) -> str:
        return "v" + self.namespace[-14:]

    def create(self) -> None:
        self.delete()
        ip("netns", "add", self.namespace)
        ip("link", "add", self.host_end, "type", "veth", "peer", "name", "eth0", "netns", self.namespace)
        ip("link", "set", self.host_end, "master", self.bridge.name, "up")
        inside = ("netns", "exec", self.namespace, "ip")
        ip(*inside, "addr", "add", f"{self.address}/{self.bridge.subnet.prefixlen}", "dev", "eth0")
        ip(*inside, "link", "set", "lo", "up")
        ip(*inside, "link", "set", "eth0", "up")
        ip(*inside, "route", "add", "default", "via", self.bridge.gateway)

    def delete(self) -> None:
        ip("link", "del", self.host_end, check=False)
        ip("netns", "del", self.namespace, check=False)
        ip("neigh", "flush", "to", self.address, check=False)

    def enter(self) -> list[str]:
        """The command prefix that runs a program inside this pod's namespace."""
        return ["ip", "netns", "exec", self.namespace]
