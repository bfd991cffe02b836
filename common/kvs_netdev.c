/*
 * kvs_netdev.c — the interface of an address (kvs_netdev.h), from
 * getifaddrs; the route to a server from a connected UDP socket (no packet is
 * sent).
 */
#include "kvs_netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The host part of listen into host (n bytes): "[v6]:p" -> "v6", "h:p" -> "h". */
static int host_of(const char *listen, char *host, size_t n)
{
    const char *end;
    if (listen[0] == '[') {
        end = strchr(listen, ']');
        if (end == NULL || (end[1] != ':' && end[1] != '\0'))
            return -1;
        listen++;
    } else {
        end = strrchr(listen, ':');
        if (end == NULL)
            end = listen + strlen(listen);
    }
    size_t len = (size_t)(end - listen);
    if (len >= n)
        return -1;
    memcpy(host, listen, len);
    host[len] = '\0';
    return 0;
}

/* The interface with IFF_LOOPBACK (loop) or the one that owns sa:
 * KVS_NETDEV_LOOPBACK or KVS_NETDEV_ONE by that interface's flags, or 0. */
static int iface_of(const struct sockaddr *sa, int loop, char *dev, size_t n)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_name == NULL)
            continue;
        int fam = i->ifa_addr->sa_family;
        if (loop)
            found = (i->ifa_flags & IFF_LOOPBACK) != 0;
        else if (sa->sa_family == AF_INET && fam == AF_INET)
            found = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr;
        else if (sa->sa_family == AF_INET6 && fam == AF_INET6)
            found = memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                           &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                           sizeof(struct in6_addr)) == 0;
        if (found && (size_t)snprintf(dev, n, "%s", i->ifa_name) >= n)
            found = 0, dev[0] = '\0';
        else if (found)
            found = (i->ifa_flags & IFF_LOOPBACK) ? KVS_NETDEV_LOOPBACK : KVS_NETDEV_ONE;
    }
    freeifaddrs(ifs);
    return found;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) ==
               127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int kvs_netdev_of_listen(const char *listen, char *dev, size_t n)
{
    char host[128];
    if (n > 0)
        dev[0] = '\0';
    if (listen == NULL || n == 0 || host_of(listen, host, sizeof host) != 0)
        return 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else if (strcmp(host, "localhost") == 0)
        return iface_of(NULL, 1, dev, n);
    else
        return 0; /* a host name: we do not resolve it here */
    if ((ss.ss_family == AF_INET && s4->sin_addr.s_addr == htonl(INADDR_ANY)) ||
        (ss.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr)))
        return 0;
    const struct sockaddr *sa = (const struct sockaddr *)&ss;
    return iface_of(sa, is_loopback(sa), dev, n);
}

int kvs_netdev_toward(const char *target, char *dev, size_t n)
{
    char host[256];
    if (n > 0)
        dev[0] = '\0';
    if (target == NULL || n == 0)
        return 0;
    static const char *const schemes[] = {"dns:///", "ipv4:", "ipv6:"};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
        if (strncmp(target, schemes[i], strlen(schemes[i])) == 0)
            target += strlen(schemes[i]);
    if (strchr(target, '/') != NULL || strncmp(target, "unix:", 5) == 0 ||
        host_of(target, host, sizeof host) != 0 || host[0] == '\0')
        return 0;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host, "9", &hints, &ai) != 0 || ai == NULL)
        return 0;
    int found = 0;
    if (is_loopback(ai->ai_addr)) {
        found = iface_of(NULL, 1, dev, n);
    } else {
        /* connect() on a UDP socket only picks the route and the source
         * address; nothing is sent. */
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage local;
        socklen_t len = sizeof local;
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&local, &len) == 0)
            found = iface_of((const struct sockaddr *)&local,
                             is_loopback((const struct sockaddr *)&local), dev, n);
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(ai);
    return found;
}
