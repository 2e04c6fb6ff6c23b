"""python -m harp.cluster: the harp-cluster command (see harp.cluster.cli)."""
from .cli import main

main()
