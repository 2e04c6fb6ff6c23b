"""Exceptions raised by HARP.

Every HARP failure is a :class:`HarpError`. Local argument problems are also
``ValueError``; a timeout is also the builtin ``TimeoutError``, so generic
handlers keep working.
"""


class HarpError(RuntimeError):
    """Base class of HARP errors."""


class InvalidArgumentError(HarpError, ValueError):
    """Bad input found on this rank (dtype, size, op, root...). The communicator stays usable."""


class MismatchError(HarpError):
    """Ranks called the same collective with different count, dtype, op or root.

    Raised on every rank; the communicator is broken afterwards."""


class PeerError(HarpError):
    """A peer died, disconnected or aborted the communicator. The communicator is broken."""


class HarpTimeoutError(HarpError, TimeoutError):
    """A blocking step ran past its timeout. The communicator is broken."""


class UnavailableError(HarpError):
    """A transport or feature is not available on this machine or build."""


class RevokedError(PeerError):
    """The communicator was revoked (``comm.revoke()`` on some rank, usually
    after a failure). Every pending and later operation raises it; recover with
    ``comm.agree()`` / ``comm.shrink()`` (see harp.elastic)."""
