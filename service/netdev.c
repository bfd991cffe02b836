/*
 * netdev.c — the interface of a listen address (netdev.h), from getifaddrs.
 */
#include "netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

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

int kvs_netdev_of_listen(const char *listen, char *dev, size_t n)
{
    char host[128];
    struct in_addr a4;
    struct in6_addr a6;
    if (n > 0)
        dev[0] = '\0';
    if (listen == NULL || n == 0 || host_of(listen, host, sizeof host) != 0)
        return 0;
    int v4 = inet_pton(AF_INET, host, &a4) == 1, v6 = !v4 && inet_pton(AF_INET6, host, &a6) == 1;
    int loop = strcmp(host, "localhost") == 0 ||
               (v4 && (ntohl(a4.s_addr) >> 24) == 127) || (v6 && IN6_IS_ADDR_LOOPBACK(&a6));
    if (!loop && !v4 && !v6)
        return 0; /* a host name: we do not resolve it here */
    if ((v4 && a4.s_addr == htonl(INADDR_ANY)) || (v6 && IN6_IS_ADDR_UNSPECIFIED(&a6)))
        return 0;
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
        else if (v4 && fam == AF_INET)
            found = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
                    a4.s_addr;
        else if (v6 && fam == AF_INET6)
            found = memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
                           &a6, sizeof a6) == 0;
        if (found && (size_t)snprintf(dev, n, "%s", i->ifa_name) >= n)
            found = 0, dev[0] = '\0';
    }
    freeifaddrs(ifs);
    return found;
}
