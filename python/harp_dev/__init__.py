"""harp_dev — HARP's developer tools, outside the runtime package (distribution harp-dev,
python/pyproject.toml).

    harp-bench allreduce -np 4 -b 8 -e 64M     harp_dev.bench: collective sweeps, nccl-tests columns
    harp-cluster up --hosts 4 --rate 1gbit     harp_dev.cluster: an emulated multi-host arena

Both stand on the public harp package; nothing in harp imports them.
"""
