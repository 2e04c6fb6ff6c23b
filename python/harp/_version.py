"""The one place HARP's version is written. pyproject.toml reads it (scikit-build-core's
regex provider), CMakeLists.txt reads it (project VERSION, libharp-nccl's ncclGetVersion
string), and ``harp.__version__`` / every console script's ``--version`` import it."""
__version__ = "0.2.0"
