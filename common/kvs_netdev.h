/*
 * kvs_netdev.h — which network interface an address is on, so the UCX data
 * plane can be kept to the interfaces the gRPC conversation uses.
 *
 * UCX's tcp transport opens a listening socket on every interface it finds,
 * and UCX trusts what its peers send (docs/TRANSFER.md, "Sessions"): a node
 * serving gRPC on 127.0.0.1 would still accept UCX connections from the
 * network. kvstashd keeps UCX to the loopback interface when it listens on
 * loopback (kvs_netdev_of_listen), libkvstash when it reaches the server over
 * loopback (kvs_netdev_toward). Other interfaces are only reported: UCX's
 * device list names RDMA devices apart from their IP interfaces (mlx5_0:1 vs
 * ib0), so keeping UCX to one IP interface would take RDMA away; there the
 * operator sets UCX_NET_DEVICES.
 */
#ifndef KVS_NETDEV_H
#define KVS_NETDEV_H

#include <stddef.h>

enum {
    KVS_NETDEV_ONE = 1,      /* an interface that is not loopback */
    KVS_NETDEV_LOOPBACK = 2, /* the loopback interface */
};

/*
 * The interface that owns the host of listen ("HOST:PORT", "[V6]:PORT";
 * HOST an IPv4 or IPv6 literal or "localhost"): KVS_NETDEV_ONE or
 * KVS_NETDEV_LOOPBACK with its name in dev (n bytes, e.g. "lo"). A loopback
 * address (127.0.0.0/8, ::1, localhost) gives the loopback interface. 0 when the host does not name
 * one interface: a wildcard (0.0.0.0, ::, empty), a host name, or an address no interface has (dev
 * is then ""); the caller lets UCX use every interface.
 */
int kvs_netdev_of_listen(const char *listen, char *dev, size_t n);

/*
 * The interface this host reaches a server through: target is a gRPC target
 * ("HOST:PORT", "[V6]:PORT", optionally "dns:///", "ipv4:" or "ipv6:" in
 * front). KVS_NETDEV_ONE or KVS_NETDEV_LOOPBACK with the name in dev: the
 * loopback interface for a loopback
 * address or "localhost", else the interface that owns the local address the
 * kernel picks for the route to HOST (a host name is resolved first,
 * getaddrinfo). 0 (dev "") when that cannot be told: a unix: target, no
 * route, a name that does not resolve.
 */
int kvs_netdev_toward(const char *target, char *dev, size_t n);

#endif /* KVS_NETDEV_H */
