"""python -m harp_dev.cluster: the harp-cluster command (see harp_dev.cluster.cli)."""
from .cli import main

main()
