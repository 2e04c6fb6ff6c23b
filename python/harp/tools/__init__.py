"""harp.tools — the command-line tools of the runtime package.

    harp-config    harp.tools.config: where HARP is installed, what this build can do, which
                   algorithm a call would get (--explain)

harp-run is harp.launch; harp-status (python/harp/status.py) joins this package when its
current rework lands. Developer tools (harp-bench, harp-cluster) live in harp_dev instead.
"""
