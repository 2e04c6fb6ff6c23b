"""Build script for ``harp._dpdk_cffi``: cffi *API mode* bindings to DPDK.

Run by CMake (transport/dpdk/CMakeLists.txt) when libdpdk and cffi are present::

    python _dpdk_build.py OUTDIR      # writes OUTDIR/harp/_dpdk_cffi*.so

API mode compiles a real C extension against DPDK's headers, which is the only
way to reach DPDK's fast-path functions (rte_eth_rx_burst and friends are
``static inline``) and thread-local ``rte_errno``; ABI mode could not call them.
"""
import os
import shlex
import subprocess
import sys

import cffi

# What harp.dpdk reads of a port; declared once, for cffi's cdef and the C source alike.
PORT_INFO = """
struct harp_port_info {
    char driver[64];
    uint16_t mtu;
    uint16_t max_mtu;
    uint32_t max_rx_pktlen;
    uint8_t mac[6];
    int link_up;
    uint32_t link_speed;      /* Mbit/s */
    int link_full_duplex;
    int started;
    uint64_t ipackets, opackets, ibytes, obytes, imissed, ierrors, oerrors, rx_nombuf;
};
"""

CDEF = """
const char *rte_version(void);
int rte_eal_init(int argc, char **argv);
int rte_eal_cleanup(void);
int rte_eal_has_hugepages(void);
int harp_rte_errno(void);
const char *rte_strerror(int errnum);

int rte_dev_probe(const char *devargs);
uint16_t rte_eth_dev_count_avail(void);
int rte_eth_dev_is_valid_port(uint16_t port_id);
int rte_eth_dev_get_port_by_name(const char *name, uint16_t *port_id);
int rte_eth_dev_get_name_by_port(uint16_t port_id, char *name);

""" + PORT_INFO + """
int harp_port_info(uint16_t port, struct harp_port_info *out);
int harp_port_start(uint16_t port, unsigned nb_mbufs);
int harp_port_rx_drain(uint16_t port, unsigned max);
int harp_port_tx_frames(uint16_t port, unsigned n, unsigned len, const uint8_t *dst_mac, uint16_t ethertype);
"""

SOURCE = r"""
#include <string.h>
#include <stdio.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_version.h>

static int harp_rte_errno(void) { return rte_errno; }   /* per-lcore TLS macro */

""" + PORT_INFO + r"""

static struct rte_mempool *harp_pools[RTE_MAX_ETHPORTS];

static int harp_port_info(uint16_t port, struct harp_port_info *out) {
    struct rte_eth_dev_info info;
    struct rte_eth_link link;
    struct rte_eth_stats st;
    struct rte_ether_addr a;
    int rc;
    memset(out, 0, sizeof *out);
    rc = rte_eth_dev_info_get(port, &info);
    if (rc != 0) return rc;
    snprintf(out->driver, sizeof out->driver, "%s", info.driver_name ? info.driver_name : "?");
    out->max_mtu = info.max_mtu;
    out->max_rx_pktlen = info.max_rx_pktlen;
    rte_eth_dev_get_mtu(port, &out->mtu);
    if (rte_eth_macaddr_get(port, &a) == 0) memcpy(out->mac, a.addr_bytes, 6);
    memset(&link, 0, sizeof link);
    if (rte_eth_link_get_nowait(port, &link) == 0) {
        out->link_up = link.link_status == RTE_ETH_LINK_UP;
        out->link_speed = link.link_speed;
        out->link_full_duplex = link.link_duplex == RTE_ETH_LINK_FULL_DUPLEX;
    }
    out->started = harp_pools[port] != NULL;
    if (rte_eth_stats_get(port, &st) == 0) {
        out->ipackets = st.ipackets; out->opackets = st.opackets;
        out->ibytes = st.ibytes; out->obytes = st.obytes;
        out->imissed = st.imissed; out->ierrors = st.ierrors; out->oerrors = st.oerrors;
        out->rx_nombuf = st.rx_nombuf;
    }
    return 0;
}

/* One rx and one tx queue, started: enough to watch link state and counters. */
static int harp_port_start(uint16_t port, unsigned nb_mbufs) {
    struct rte_eth_conf conf;
    char name[32];
    uint16_t nrx = 512, ntx = 512;
    int rc;
    if (harp_pools[port]) return 0;
    snprintf(name, sizeof name, "harp_py_%u", port);
    harp_pools[port] = rte_pktmbuf_pool_create(name, nb_mbufs, 32, 0, RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
    if (!harp_pools[port]) return -rte_errno;
    memset(&conf, 0, sizeof conf);
    if ((rc = rte_eth_dev_configure(port, 1, 1, &conf)) != 0) return rc;
    rte_eth_dev_adjust_nb_rx_tx_desc(port, &nrx, &ntx);
    if ((rc = rte_eth_rx_queue_setup(port, 0, nrx, rte_socket_id(), NULL, harp_pools[port])) != 0) return rc;
    if ((rc = rte_eth_tx_queue_setup(port, 0, ntx, rte_socket_id(), NULL)) != 0) return rc;
    return rte_eth_dev_start(port);
}

/* rte_eth_rx_burst is static inline: only API mode can call it. */
static int harp_port_rx_drain(uint16_t port, unsigned max) {
    struct rte_mbuf *pkts[32];
    unsigned total = 0;
    while (total < max) {
        uint16_t n = rte_eth_rx_burst(port, 0, pkts, 32);
        if (n == 0) break;
        for (uint16_t i = 0; i < n; i++) rte_pktmbuf_free(pkts[i]);
        total += n;
    }
    return (int)total;
}

static int harp_port_tx_frames(uint16_t port, unsigned n, unsigned len, const uint8_t *dst_mac, uint16_t ethertype) {
    struct rte_ether_addr src;
    unsigned sent = 0;
    if (!harp_pools[port]) return -EINVAL;
    if (len < 60) len = 60;
    rte_eth_macaddr_get(port, &src);
    while (sent < n) {
        struct rte_mbuf *m = rte_pktmbuf_alloc(harp_pools[port]);
        uint8_t *d;
        if (!m) break;
        d = (uint8_t *)rte_pktmbuf_append(m, len);
        if (!d) { rte_pktmbuf_free(m); break; }
        memset(d, 0, len);
        memcpy(d, dst_mac, 6);
        memcpy(d + 6, src.addr_bytes, 6);
        d[12] = ethertype >> 8; d[13] = ethertype & 0xff;
        if (rte_eth_tx_burst(port, 0, &m, 1) != 1) { rte_pktmbuf_free(m); break; }
        sent++;
    }
    return (int)sent;
}
"""


def pkgconfig(*args):
    return shlex.split(subprocess.check_output(["pkg-config", *args, "libdpdk"], text=True))


def make_ffi():
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.set_source("harp._dpdk_cffi", SOURCE, extra_compile_args=pkgconfig("--cflags") + ["-Wno-unused-function"],
                   extra_link_args=pkgconfig("--libs"))
    return ffi


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    path = make_ffi().compile(tmpdir=out, verbose=False)
    print(path)
