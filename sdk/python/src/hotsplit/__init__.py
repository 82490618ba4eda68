"""hotsplit: a client for hotsplit's Redis door that carries a session per scope.

    import hotsplit
    client = hotsplit.Client(host="127.0.0.1", port=6380)   # redis.Redis settings: ssl, password, ...
    alice = client.session(client_id="alice")                # one scope: a user, or a request
    alice.publish("post:9", 3, b"hello")
    assert alice.read("post:9") == b"hello"                  # through any instance
    token = alice.token                                      # hand it to another service ...
    other = client.session(token=token)                      # ... which goes on with it
"""

from .client import Client, Published, Read, Session
from .errors import (
    DeadlineError,
    FloorError,
    FullError,
    HotsplitError,
    InvalidError,
    NoAuthError,
    NoPermError,
    OverloadedError,
    StaleError,
    UnavailableError,
    WrongPassError,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "DeadlineError",
    "FloorError",
    "FullError",
    "HotsplitError",
    "InvalidError",
    "NoAuthError",
    "NoPermError",
    "OverloadedError",
    "Published",
    "Read",
    "Session",
    "StaleError",
    "UnavailableError",
    "WrongPassError",
]
