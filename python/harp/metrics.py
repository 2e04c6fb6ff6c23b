"""harp.metrics — HARP's per-collective counters in Prometheus' text format.

Every communicator counts, per (collective, algorithm), the calls that
completed, their bytes, and their latency in a log2 histogram (kept in
core/observe/recorder.h by the same hook as the flight recorder; HARP_FR_ENTRIES=0
turns both off). This module turns them into Prometheus metrics with the
``prometheus-client`` package (``pip install harp[metrics]``)::

    import harp.metrics
    harp.metrics.write_textfile("/var/lib/node_exporter/harp.prom")  # node_exporter's textfile collector
    harp.metrics.start_http_server(9464)                             # or serve /metrics (127.0.0.1 by default)
    text = harp.metrics.generate()                                   # the exposition text

Metrics (labels: collective, algorithm, transport, comm, rank):
  harp_collective_calls_total              completed calls
  harp_collective_bytes_total              bytes per rank (count x itemsize of the call)
  harp_collective_latency_seconds          histogram of the timed calls (buckets at powers of two of the
                                           time-stamp counter): every call of >= HARP_FR_TIME_BYTES and
                                           one in HARP_FR_TIME_EVERY of the smaller ones (1: every call)
  harp_collective_busbw_bytes_per_second   mean bus bandwidth of the timed calls (their bytes / their time
                                           x nccl-tests' bus factor)
  harp_communicator_ops_started            last collective started (gauge), and ..._completed

Job-wide (``registry(job=True)``, ``start_http_server(port, job=True)``): the process holding rank 0 of a
communicator asks the whole communicator through the job view (harp-status --job) at each scrape:
  harp_job_ranks{comm, state}              ranks per state: ok, dead, unreachable, lagging
  harp_job_view_seconds{comm}              how long the view took

Threading: any thread; reading the counters never blocks a collective.
"""
from __future__ import annotations

from . import debug

__all__ = ["HarpCollector", "JobCollector", "registry", "generate", "write_textfile", "start_http_server", "bus_factor"]


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth."""
    if n <= 1:
        return 1.0
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("allgather", "reduce_scatter", "alltoall", "alltoallv", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


class HarpCollector:
    """A prometheus_client collector over harp.debug.status() (this process's communicators)."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        labels = ["collective", "algorithm", "transport", "comm", "rank"]
        calls = CounterMetricFamily("harp_collective_calls", "Completed HARP collective calls", labels=labels)
        nbytes = CounterMetricFamily("harp_collective_bytes", "Bytes per rank of completed calls", labels=labels)
        lat = HistogramMetricFamily("harp_collective_latency_seconds", "Latency of completed calls", labels=labels)
        busbw = GaugeMetricFamily("harp_collective_busbw_bytes_per_second",
                                  "Mean bus bandwidth of completed calls", labels=labels)
        started = GaugeMetricFamily("harp_communicator_ops_started", "Last collective started",
                                    labels=["comm", "rank"])
        completed = GaugeMetricFamily("harp_communicator_ops_completed", "Last collective completed",
                                      labels=["comm", "rank"])
        for c in debug.status()["comms"]:
            started.add_metric([c["comm"], str(c["rank"])], c["started"])
            completed.add_metric([c["comm"], str(c["rank"])], c["completed"])
            for m in c["metrics"]:
                lv = [m["collective"], m["algorithm"], c["transport"], c["comm"], str(c["rank"])]
                calls.add_metric(lv, m["count"])
                nbytes.add_metric(lv, m["bytes"])
                cum, buckets = 0, []
                for le, n in m["buckets"]:
                    cum += n
                    if n or buckets:  # from the first non-empty bucket on
                        buckets.append((repr(float(le)), cum))
                buckets.append(("+Inf", m["timed"]))
                lat.add_metric(lv, buckets, m["seconds"])
                if m["seconds"] > 0:
                    busbw.add_metric(lv, m["timed_bytes"] / m["seconds"] * bus_factor(m["collective"], c["size"]))
        yield from (calls, nbytes, lat, busbw, started, completed)


class JobCollector:
    """Job-wide gauges for the communicators whose rank 0 lives in this process (the job view, through this
    process's own status socket for the endpoint and key; harp.status)."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from . import _harp, status

        ranks = GaugeMetricFamily("harp_job_ranks", "Ranks of the communicator by state (the job view)",
                                  labels=["comm", "state"])
        took = GaugeMetricFamily("harp_job_view_seconds", "Time the job view took", labels=["comm"])
        sock = _harp.obs_status_socket()
        eps, _ = status.job_endpoints([sock]) if sock else ([], [])
        for e in eps:
            if e["rank"] != 0:
                continue
            try:
                v = status.job_view(e["addr"], e["comm"], bytes.fromhex(e["key"]), e["size"], timeout=5.0)
            except (OSError, ValueError):
                continue
            a = v["analysis"]
            ok = sum(1 for r in v["ranks"] if r["state"] == "ok")
            for state, n in (("ok", ok), ("dead", len(a["dead"])), ("unreachable", len(a["unreachable"])),
                             ("lagging", len(a["lagging"]))):
                ranks.add_metric([e["comm"], state], n)
            took.add_metric([e["comm"]], v["seconds"])
        yield from (ranks, took)


_registries = {}


def registry(job: bool = False):
    """A CollectorRegistry holding HarpCollector, and JobCollector with job=True (each made once)."""
    if job not in _registries:
        from prometheus_client import CollectorRegistry
        r = CollectorRegistry(auto_describe=False)
        r.register(HarpCollector())
        if job:
            r.register(JobCollector())
        _registries[job] = r
    return _registries[job]


def generate(job: bool = False) -> str:
    """The Prometheus text exposition of this process's HARP metrics (job=True: with the job-wide gauges)."""
    from prometheus_client import generate_latest
    return generate_latest(registry(job)).decode()


def write_textfile(path: str) -> None:
    """Write the metrics for node_exporter's textfile collector (atomically)."""
    from prometheus_client import write_to_textfile
    write_to_textfile(path, registry())


def start_http_server(port: int, addr: str = "127.0.0.1", job: bool = False):
    """Serve /metrics on addr:port (loopback unless told otherwise: the metrics name hosts and sizes)."""
    from prometheus_client import start_http_server as serve
    return serve(port, addr=addr, registry=registry(job))
