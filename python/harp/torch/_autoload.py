"""Entry point of the `torch.backends` group: torch calls load() at import.

It must never break `import torch`: any failure (e.g. a harp build without
its extension) is reported as a warning and the backend stays unregistered.
"""


def load():
    try:
        from . import register

        register()
    except Exception as e:  # noqa: BLE001
        import warnings

        warnings.warn(f"harp: torch.distributed backend 'harp' not registered: {e}", RuntimeWarning, stacklevel=2)
