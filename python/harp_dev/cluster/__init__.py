"""harp_dev.cluster: an emulated multi-host cluster on one machine (the "VPC arena").

    harp-cluster up --hosts 4 --rate 1gbit           # 4 emulated hosts, 1 Gbit/s uplinks
    harp-cluster run --hosts 4 --ppn 1 -- python train.py
    harp-cluster status
    harp-cluster down

Each emulated host is a network namespace (own address per NIC, shaped uplink
on a shared bridge), a UTS namespace (own hostname) and a mount namespace (a
private /dev/shm, a private /etc/hosts naming every host), held open by one
small holder process per host; launched ranks enter the holder's namespaces
with nsenter. Ranks on different hosts therefore cannot take the shared-memory
path and see different hostnames, as on a real cluster.

Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2, tc and util-linux.
State lives in /run/harp-cluster/<name>.json, so `status` and `down` work from
any process. Modules: topology (names, addresses, state file), net (namespaces,
links, shaping), holder (the per-host process), launchers (harp, torchrun,
mpirun command lines), runner (start, watch, stop a job), cli.
"""
