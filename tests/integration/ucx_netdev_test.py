#!/usr/bin/env python3
"""ucx_netdev_test.py KVSTASHD — a kvstashd serving gRPC on loopback uses shared
memory alone for UCX, and keeps UCX's network transports on loopback when the
operator brings them back (common/kvs_netdev.h, transfer/xfer.h
KVS_XFER_TLS_SHM).

UCX's tcp transport opens a listening socket on every interface it finds, and
UCX 1.13 aborts on 13 crafted bytes to it (docs/TRANSFER.md "Sessions"); a node
serving gRPC on 127.0.0.1 must not take UCX connections from the network.
Checked from /proc (the TCP sockets kvstashd listens on: its fds' inodes in
/proc/net/tcp and tcp6, state LISTEN): by default gRPC's is the only one (no UCX
tcp port); with UCX_TLS=tcp they are all on loopback; UCX_NET_DEVICES set in the
environment must still win (its sockets then sit where it says), and with a
wildcard listen address UCX is left alone. Where the machine has no interface
but loopback, only the first two checks mean anything (said in the output).
"""
import ipaddress
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvs_testlib import Kvstashd, fail, listening  # noqa: E402


def external_ipv4():
    """(interface, address) of one non-loopback IPv4 interface, or None."""
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        try:
            import fcntl
            import struct
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            res = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            s.close()
            return name, ipaddress.IPv4Address(res[20:24])
        except OSError:
            continue
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    kvstashd = sys.argv[1]
    env_saved = os.environ.pop("UCX_NET_DEVICES", None)
    tls_saved = os.environ.pop("UCX_TLS", None)
    ext = external_ipv4()
    with Kvstashd(kvstashd) as srv:
        socks = listening(srv.proc.pid)
        if len(socks) != 1 or socks[0][1] != srv.port:
            fail("kvstashd on 127.0.0.1 listens on %s, expected gRPC's port %d alone (UCX on "
                 "shared memory, no tcp port)" % (socks, srv.port))
        if srv.stop() != 0:
            fail("kvstashd did not exit 0")
    print("ok - listen 127.0.0.1: gRPC's socket alone, UCX on shared memory")
    os.environ["UCX_TLS"] = "tcp"  # the operator brings tcp back: loopback still
    try:
        with Kvstashd(kvstashd) as srv:
            socks = listening(srv.proc.pid)
            if len(socks) < 2:
                fail("UCX_TLS=tcp: kvstashd listens on %d TCP sockets, expected gRPC's and "
                     "UCX's: %s" % (len(socks), socks))
            outside = [s for s in socks if not s[0].is_loopback]
            if outside:
                fail("kvstashd on 127.0.0.1 listens outside loopback: %s" % outside)
            if srv.stop() != 0:
                fail("kvstashd did not exit 0")
    finally:
        del os.environ["UCX_TLS"]
    print("ok - listen 127.0.0.1, UCX_TLS=tcp: %d listening sockets, all on loopback"
          % len(socks))
    if ext is None:
        print("ok - no non-loopback IPv4 interface here: the other cases say nothing, skipped")
        return 0
    dev, addr = ext
    os.environ["UCX_NET_DEVICES"] = dev  # the operator's choice wins
    try:
        with Kvstashd(kvstashd) as srv:
            socks = listening(srv.proc.pid)
            if not any(a == addr for a, _ in socks):
                fail("UCX_NET_DEVICES=%s: no socket on %s: %s" % (dev, addr, socks))
            srv.stop()
    finally:
        del os.environ["UCX_NET_DEVICES"]
    print("ok - UCX_NET_DEVICES=%s: UCX listens on %s" % (dev, addr))
    # A wildcard gRPC address: UCX keeps every interface, this one included.
    srv = Kvstashd(kvstashd)
    srv.cmd = [kvstashd, "--listen", "0.0.0.0:0"]
    with srv:
        socks = listening(srv.proc.pid)
        if not any(a == addr for a, _ in socks):
            fail("listen 0.0.0.0: UCX has no socket on %s: %s" % (addr, socks))
        srv.stop()
    print("ok - listen 0.0.0.0: UCX also on %s (%s)" % (addr, dev))
    if env_saved is not None:
        os.environ["UCX_NET_DEVICES"] = env_saved
    if tls_saved is not None:
        os.environ["UCX_TLS"] = tls_saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
