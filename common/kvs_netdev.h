/*
 * kvs_netdev.h — which network interface an address is on, so the UCX data
 * plane can be kept to the interfaces the gRPC conversation uses.
 *
 * UCX's tcp transport opens a listening socket on every interface it finds,
 * and UCX trusts what its peers send (docs/TRANSFER.md, "Sessions"): a node
 * serving gRPC on 127.0.0.1 would still accept UCX connections from the
 * network. kvstashd gives UCX the interface of its listen address
 * (kvs_netdev_of_listen), libkvstash the interface it reaches the server
 * through (kvs_netdev_toward).
 */
#ifndef KVS_NETDEV_H
#define KVS_NETDEV_H

#include <stddef.h>

/*
 * The interface that owns the host of listen ("HOST:PORT", "[V6]:PORT";
 * HOST an IPv4 or IPv6 literal or "localhost"): 1 with its name in dev (n
 * bytes, e.g. "lo"). A loopback address (127.0.0.0/8, ::1, localhost) gives
 * the loopback interface. 0 when the host does not name one interface: a
 * wildcard (0.0.0.0, ::, empty), a host name, or an address no interface
 * has (dev is then ""); the caller lets UCX use every interface.
 */
int kvs_netdev_of_listen(const char *listen, char *dev, size_t n);

/*
 * The interface this host reaches a server through: target is a gRPC target
 * ("HOST:PORT", "[V6]:PORT", optionally "dns:///", "ipv4:" or "ipv6:" in
 * front). 1 with the name in dev: the loopback interface for a loopback
 * address or "localhost", else the interface that owns the local address the
 * kernel picks for the route to HOST (a host name is resolved first,
 * getaddrinfo). 0 (dev "") when that cannot be told: a unix: target, no
 * route, a name that does not resolve.
 */
int kvs_netdev_toward(const char *target, char *dev, size_t n);

#endif /* KVS_NETDEV_H */
