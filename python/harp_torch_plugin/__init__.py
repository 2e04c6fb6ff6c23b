"""Target of harp's `torch.backends` entry point (torch calls load() during `import torch`).

It lives outside the `harp` package on purpose: importing it cannot fail, so a
broken or shadowing harp (another checkout first on sys.path, a build without
its extension) turns into a warning instead of making `import torch` raise.
"""


def load():
    try:
        from harp.torch import register

        register()
    except Exception as e:  # noqa: BLE001
        import warnings

        warnings.warn(f"harp: torch.distributed backend 'harp' not registered: {e!r}", RuntimeWarning, stacklevel=2)
