"""Typed errors for the door's error prefixes (docs/API.md, "Errors" of the Redis door)."""

from typing import Dict, Optional, Type


class HotsplitError(Exception):
    """An error answer of the door; `prefix` is its first word (`FLOOR`, `UNAVAILABLE`, ...)."""

    prefix: Optional[str] = None

    def __init__(self, message: str, prefix: Optional[str] = None):
        super().__init__(message)
        if prefix is not None:
            self.prefix = prefix


class InvalidError(HotsplitError):
    """`ERR`: bad input (an invalid key or version, a refused option, a stale publish)."""

    prefix = "ERR"


class NoAuthError(HotsplitError):
    """`NOAUTH`: the connection has not authenticated and the instance has tokens."""

    prefix = "NOAUTH"


class WrongPassError(HotsplitError):
    """`WRONGPASS`: an unknown token or a user other than `default`."""

    prefix = "WRONGPASS"


class NoPermError(HotsplitError):
    """`NOPERM`: the token lacks the scope the command needs (`read`, `write`)."""

    prefix = "NOPERM"


class FloorError(HotsplitError):
    """`FLOOR`: no copy reached the read's floor yet; retry later."""

    prefix = "FLOOR"


class UnavailableError(HotsplitError):
    """`UNAVAILABLE`: a node the command needs did not answer; retry later."""

    prefix = "UNAVAILABLE"


class OverloadedError(HotsplitError):
    """`OVERLOADED`: the instance is at its in-flight bound; the command did nothing."""

    prefix = "OVERLOADED"


class DeadlineError(HotsplitError):
    """`DEADLINE`: the command's deadline passed before the store answered."""

    prefix = "DEADLINE"


class StaleError(HotsplitError):
    """`STALE`: every replica is over the class's staleness budget and the class fails."""

    prefix = "STALE"


class FullError(HotsplitError):
    """`FULL`: the embedded store is full; the publish changed nothing."""

    prefix = "FULL"


_BY_PREFIX: Dict[str, Type[HotsplitError]] = {
    cls.prefix: cls
    for cls in (
        InvalidError,
        NoAuthError,
        WrongPassError,
        NoPermError,
        FloorError,
        UnavailableError,
        OverloadedError,
        DeadlineError,
        StaleError,
        FullError,
    )
    if cls.prefix
}

# redis-py turns these prefixes into its own exceptions and drops the prefix from the text.
_REDIS_PY = {
    "NoPermissionError": "NOPERM",
    "AuthenticationError": "WRONGPASS",
    "AuthenticationWrongNumberOfArgsError": "ERR",
    "ExecAbortError": "EXECABORT",
}


def from_redis(error: Exception) -> Exception:
    """The typed error for a redis-py error answer; other errors (connection, timeout) as they are."""
    import redis

    text = str(error)
    mapped = _REDIS_PY.get(type(error).__name__)
    if mapped is not None:
        if "Authentication required" in text:
            mapped = "NOAUTH"
        return _BY_PREFIX.get(mapped, HotsplitError)(text, mapped)
    if isinstance(error, redis.exceptions.ResponseError):
        word = text.split(" ", 1)[0]
        cls = _BY_PREFIX.get(word)
        if cls is not None:
            return cls(text, word)
        # redis-py strips nothing else: an answer without a known prefix is bad input.
        return InvalidError(text, "ERR")
    return error
