/*
 * netdev.h — which network interface a listen address is on, so the UCX data
 * plane can be kept to the interfaces gRPC serves on.
 *
 * UCX's tcp transport opens a listening socket on every interface it finds,
 * whatever address kvstashd's gRPC listener is bound to: a node serving gRPC
 * on 127.0.0.1 would still accept UCX connections from the network, and UCX
 * trusts what its peers send (docs/TRANSFER.md, "Sessions"). kvstashd
 * therefore gives UCX the interface of its listen address.
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

#endif /* KVS_NETDEV_H */
