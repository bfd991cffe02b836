/*
 * test_netdev.c — kvs_netdev_of_listen and kvs_netdev_toward (common/kvs_netdev.h):
 * the interface an address is on or is reached through, checked against this
 * machine's own interface list.
 */
#include "kvs_test.h"
#include "kvs_netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* This machine's loopback interface, and one non-loopback IPv4 address with
 * its interface ("" when there is none). */
static char g_lo[IF_NAMESIZE], g_ext_dev[IF_NAMESIZE], g_ext_addr[INET_ADDRSTRLEN];

static int suite_init(void)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return 1;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr == NULL)
            continue;
        if ((i->ifa_flags & IFF_LOOPBACK) && !g_lo[0])
            snprintf(g_lo, sizeof g_lo, "%s", i->ifa_name);
        if (!(i->ifa_flags & IFF_LOOPBACK) && i->ifa_addr->sa_family == AF_INET && !g_ext_dev[0]) {
            snprintf(g_ext_dev, sizeof g_ext_dev, "%s", i->ifa_name);
            inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, g_ext_addr,
                      sizeof g_ext_addr);
        }
    }
    freeifaddrs(ifs);
    return g_lo[0] == '\0'; /* every Linux machine has one */
}

static int suite_cleanup(void) { return 0; }

static void test_loopback(void)
{
    static const char *const loop[] = {"127.0.0.1:50551", "127.0.0.1:0", "127.3.4.5:1",
                                       "[::1]:50551",     "localhost:1", "localhost"};
    for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
        char dev[IF_NAMESIZE] = "x";
        CU_ASSERT_EQUAL(kvs_netdev_of_listen(loop[i], dev, sizeof dev), KVS_NETDEV_LOOPBACK);
        CU_ASSERT_STRING_EQUAL(dev, g_lo);
    }
}

/* Every interface (0, dev "") for what does not name one interface. */
static void test_every_interface(void)
{
    static const char *const all[] = {
        "0.0.0.0:50551", "[::]:50551", ":50551", "", "kvstash.example:50551",
        "203.0.113.77:1", /* TEST-NET-3: no interface of ours */
        "[::1", "[::1]x", "999.1.1.1:2", "[2001:db8::1]:3"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        char dev[IF_NAMESIZE] = "x";
        CU_ASSERT_EQUAL(kvs_netdev_of_listen(all[i], dev, sizeof dev), 0);
        CU_ASSERT_STRING_EQUAL(dev, "");
    }
    char dev[IF_NAMESIZE] = "x";
    CU_ASSERT_EQUAL(kvs_netdev_of_listen(NULL, dev, sizeof dev), 0);
    /* A name that does not fit is no answer (never a cut name). */
    char tiny[2] = "x";
    CU_ASSERT_EQUAL(kvs_netdev_of_listen("127.0.0.1:1", tiny, sizeof tiny), 0);
    CU_ASSERT_STRING_EQUAL(tiny, "");
}

static void test_own_address(void)
{
    if (!g_ext_dev[0]) {
        fprintf(stderr, "\n  no non-loopback IPv4 interface here: only the absence is checked\n");
        return;
    }
    char listen[64], dev[IF_NAMESIZE] = "x";
    snprintf(listen, sizeof listen, "%s:50551", g_ext_addr);
    CU_ASSERT_EQUAL(kvs_netdev_of_listen(listen, dev, sizeof dev), KVS_NETDEV_ONE);
    CU_ASSERT_STRING_EQUAL(dev, g_ext_dev);
}

/* The interface toward a server: loopback targets, this machine's own
 * address, and what cannot be told. */
static void test_toward(void)
{
    static const char *const loop[] = {"127.0.0.1:50551",  "dns:///127.0.0.1:1",
                                       "ipv4:127.0.0.1:1", "localhost:50551",
                                       "[::1]:1",          "ipv6:[::1]:1"};
    for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
        char dev[IF_NAMESIZE] = "x";
        CU_ASSERT_EQUAL(kvs_netdev_toward(loop[i], dev, sizeof dev), KVS_NETDEV_LOOPBACK);
        CU_ASSERT_STRING_EQUAL(dev, g_lo);
    }
    static const char *const none[] = {"unix:/run/kvstash.sock", "unix:///run/x", "", ":50551"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        char dev[IF_NAMESIZE] = "x";
        CU_ASSERT_EQUAL(kvs_netdev_toward(none[i], dev, sizeof dev), 0);
        CU_ASSERT_STRING_EQUAL(dev, "");
    }
    CU_ASSERT_EQUAL(kvs_netdev_toward(NULL, g_lo, 0), 0);
    if (g_ext_dev[0]) {
        char target[64], dev[IF_NAMESIZE] = "x";
        snprintf(target, sizeof target, "%s:50551", g_ext_addr);
        CU_ASSERT_EQUAL(kvs_netdev_toward(target, dev, sizeof dev), KVS_NETDEV_ONE);
        CU_ASSERT_STRING_EQUAL(dev, g_ext_dev);
    }
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"loopback", test_loopback},
        {"every_interface", test_every_interface},
        {"own_address", test_own_address},
        {"toward", test_toward},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"netdev", suite_init, suite_cleanup, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
