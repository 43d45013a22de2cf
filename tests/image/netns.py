"""A node's network for image-run pods, made of network namespaces (what CNI and kube-proxy do
on a real node; neither runs here).

::

    host ── veth ── node netns (br0 = gateway, forwarding, the Service DNAT rules)
                       ├── veth ── pod netns (eth0 = pod IP/32)
                       └── veth ── pod netns ...

The host gets exactly one veth and one route (the node's pod range), so this machine's own
settings are untouched: forwarding is switched on only inside the node's namespace. Pods
route everything through the node (their address is a /32), so the node's DNAT rules see
pod-to-Service traffic both ways. ``kubernetes.default`` (the Service IP) leads to a relay on
the host's end of the veth that forwards to the API server on loopback: the API server
certificate names the Service IP, so in-cluster clients verify it as in a cluster.

Every name carries a tag unique to this process, so two test runs on one machine never share
a namespace, an interface or a range.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import socket
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """A namespace, link or rule could not be made; carries the command's error."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def _in_ns(netns: str, *cmd: str, stdin: str | None = None) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, *cmd],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if done.returncode != 0:
        raise NetworkError(f"in {netns}: {' '.join(cmd)}: {done.stderr.strip()}")


def _routes_in_use() -> str:
    return _ip("-4", "route", "show", "table", "all") + _ip("-4", "addr", "show")


def pick_pod_range() -> ipaddress.IPv4Network:
    """A /24 of 198.19.0.0/16 (benchmarking range, RFC 2544) no route or address here uses."""
    used = _routes_in_use()
    for third in random.sample(range(1, 255), 254):
        net = ipaddress.IPv4Network(f"198.19.{third}.0/24")
        if f"198.19.{third}." not in used:
            return net
    raise NetworkError("no free /24 left in 198.19.0.0/16")


@dataclass(frozen=True)
class ServiceRule:
    """One Service port to one ready endpoint (kube-proxy's job): ``vip:port -> ip:port``."""

    vip: str
    port: int
    target_ip: str
    target_port: int


@dataclass
class NodeNetwork:
    """The namespaces and links of one emulated node. Use as a context manager."""

    pod_range: ipaddress.IPv4Network = field(default_factory=pick_pod_range)
    tag: str = field(
        default_factory=lambda: f"{os.getpid() % 100000:05d}{random.randrange(36**2):02x}"
    )
    _pods: dict[str, str] = field(default_factory=dict)
    _relays: list[_Relay] = field(default_factory=list)

    def __post_init__(self) -> None:
        hosts = list(self.pod_range.hosts())
        #: The addresses handed to pods (a node's ``podCIDR``): the lower half, so that the
        #: gateway (the last address) is never one of them, whichever address kwok picks.
        self.pod_addresses = next(self.pod_range.subnets(prefixlen_diff=1))
        self.gateway = str(hosts[-1])
        self._free = [str(h) for h in self.pod_addresses.hosts()]
        third = int(self.pod_range.network_address.packed[2])
        self.host_end = f"169.254.{third}.1"
        self.node_end = f"169.254.{third}.2"
        self.node_ns = f"mcpe-{self.tag}-node"
        self.host_link = f"mh{self.tag}"

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> NodeNetwork:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        ns = self.node_ns
        _ip("netns", "add", ns)
        _ip("link", "add", self.host_link, "type", "veth", "peer", "name", f"mn{self.tag}")
        _ip("link", "set", f"mn{self.tag}", "netns", ns)
        _ip("addr", "add", f"{self.host_end}/30", "dev", self.host_link)
        _ip("link", "set", self.host_link, "up")
        _ip("link", "set", "lo", "up", netns=ns)
        _ip("link", "set", f"mn{self.tag}", "name", "uplink", netns=ns)
        _ip("addr", "add", f"{self.node_end}/30", "dev", "uplink", netns=ns)
        _ip("link", "set", "uplink", "up", netns=ns)
        _ip("link", "add", "br0", "type", "bridge", netns=ns)
        _ip("addr", "add", f"{self.gateway}/{self.pod_range.prefixlen}", "dev", "br0", netns=ns)
        _ip("link", "set", "br0", "up", netns=ns)
        _ip("route", "add", "default", "via", self.host_end, netns=ns)
        _in_ns(ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _ip("route", "add", str(self.pod_range), "via", self.node_end, "dev", self.host_link)

    def down(self) -> None:
        for relay in self._relays:
            relay.close()
        for pod_ns in list(self._pods.values()):
            _ip("netns", "del", pod_ns, check=False)
        self._pods.clear()
        _ip("link", "del", self.host_link, check=False)  # takes its peer and the route along
        _ip("netns", "del", self.node_ns, check=False)

    # ---------------------------------------------------------------- pods

    def owns(self, address: str) -> bool:
        """True for an address of this node's pod range."""
        try:
            return ipaddress.IPv4Address(address) in self.pod_range
        except ValueError:
            return False

    def take_address(self) -> str:
        """An unused pod address of this node (for a pod the control plane did not address)."""
        return self._free.pop(0)

    def attach(self, key: str, address: str) -> str:
        """A network namespace holding ``address``; returns its path for ``podman --network``."""
        if ipaddress.IPv4Address(address) not in self.pod_addresses:
            raise NetworkError(f"{address} is not in this node's pod range {self.pod_addresses}")
        if address in self._free:
            self._free.remove(address)
        index = len(self._pods) + 1
        pod_ns = f"mcpe-{self.tag}-p{index}"
        outer, inner = f"mp{self.tag}{index}"[:15], f"mq{self.tag}{index}"[:15]
        _ip("netns", "add", pod_ns)
        self._pods[key] = pod_ns
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", outer, "netns", self.node_ns)
        _ip("link", "set", inner, "netns", pod_ns)
        _ip("link", "set", outer, "master", "br0", "up", netns=self.node_ns)
        _ip("link", "set", "lo", "up", netns=pod_ns)
        _ip("link", "set", inner, "name", "eth0", netns=pod_ns)
        _ip("addr", "add", f"{address}/32", "dev", "eth0", netns=pod_ns)
        _ip("link", "set", "eth0", "up", netns=pod_ns)
        _ip("route", "add", self.gateway, "dev", "eth0", netns=pod_ns)
        _ip("route", "add", "default", "via", self.gateway, netns=pod_ns)
        return str(NETNS_DIR / pod_ns)

    def detach(self, key: str) -> None:
        pod_ns = self._pods.pop(key, None)
        if pod_ns:
            _ip("netns", "del", pod_ns, check=False)

    # ---------------------------------------------------------------- services

    def set_services(self, rules: Iterable[ServiceRule]) -> None:
        """Replace the node's Service rules in one step (``iptables-restore`` of its nat table)."""
        lines = ["*nat", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        lines += [":POSTROUTING ACCEPT [0:0]", ":MCPE-SERVICES - [0:0]"]
        lines.append("-A PREROUTING -j MCPE-SERVICES")
        for rule in sorted(set(rules), key=lambda r: (r.vip, r.port)):
            lines.append(
                f"-A MCPE-SERVICES -d {rule.vip}/32 -p tcp --dport {rule.port} "
                f"-j DNAT --to-destination {rule.target_ip}:{rule.target_port}"
            )
        lines.append("COMMIT")
        _in_ns(self.node_ns, "iptables-restore", stdin="\n".join(lines) + "\n")

    def relay_to_host(self, target: tuple[str, int]) -> ServiceRule:
        """A relay on the host's end of the uplink to ``target`` (a loopback listener such as
        the API server); returns the rule target half (``target_ip:target_port``) with vip
        unset, for :meth:`set_services`."""
        relay = _Relay((self.host_end, 0), target)
        self._relays.append(relay)
        return ServiceRule("", 0, self.host_end, relay.port)


class _Relay:
    """A TCP relay in threads: enough for the few long-lived connections of two containers."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(listen)
        self.port = self._server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
