"""The client and its sessions: every call of a session sends the tokens it holds with `SESSION`
and keeps the token the service answers in place of the ones that call sent, so answers that
arrive out of order (calls at once) are merged by the service and no floor is lost."""

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import redis

from .errors import from_redis

Value = Union[bytes, str]


@dataclass(frozen=True)
class Read:
    """A read's value with its metadata (`meta=True`)."""

    value: Optional[bytes]
    """The value; `None` when the key is missing or invalidated."""
    version: Optional[int]
    """The version served."""
    copy: Optional[int]
    """The copy that served it."""
    served_by: Optional[str]
    """`node=…;role=primary|replica` (or `embedded`)."""
    route: Optional[str]
    """`class=…;reason=…[;source=near-cache;age_ms=…]`."""
    age_ms: Optional[int]
    """The near-cache age of the value, when the near cache answered."""


@dataclass(frozen=True)
class Published:
    """A publish or invalidate report."""

    key: str
    version: int
    status: str
    """`done`, `queued`, `stale`, `conflict` or `incomplete`."""
    http_status: int
    counts: Dict[str, int]
    """`copies`, `applied`, `current`, `stale`, `conflict`, `failed`, `queued`, `dropped`."""


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _fields(reply: Any) -> Dict[str, Any]:
    """A map answer as a dict of text names: RESP3 answers a dict, RESP2 a flat list."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[0::2], reply[1::2]))
    return {_text(name): value for name, value in items}


class Session:
    """The floors of one scope (a user, a request): the tokens it holds, sent with every call.

    Thread-safe; share one across the calls of its scope, and make one per scope. `token` gets
    and sets what it holds, to hand the session to another service or process.
    """

    def __init__(self, client: "Client", token: Optional[str] = None,
                 client_id: Optional[str] = None, read_class: Optional[str] = None):
        self._client = client
        self._lock = threading.Lock()
        self._tokens: List[str] = []
        self.client_id = client_id
        """The client id of this scope's calls (its affine copy); `None`: the connection's."""
        self.read_class = read_class
        """The read class of this scope's reads; `None`: the family's default."""
        if token:
            self.token = token

    @property
    def token(self) -> Optional[str]:
        """The session token: the tokens held, comma-separated (the service merges them)."""
        with self._lock:
            return ",".join(self._tokens) or None

    @token.setter
    def token(self, token: Optional[str]) -> None:
        with self._lock:
            self._tokens = [part.strip() for part in (token or "").split(",") if part.strip()]

    def _sent(self) -> List[str]:
        with self._lock:
            return list(self._tokens)

    def _keep(self, sent: Sequence[str], answered: Any) -> None:
        token = _text(answered)
        if not token:
            return
        with self._lock:
            self._tokens = [held for held in self._tokens if held not in sent and held != token]
            self._tokens.append(token)

    def read(self, key: str, **options: Any) -> Union[Optional[bytes], Read]:
        """`Client.read` in this session."""
        return self._client.read(key, session=self, **options)

    def publish(self, key: str, version: Union[int, str, None], value: Value,
                **options: Any) -> Published:
        """`Client.publish` in this session."""
        return self._client.publish(key, version, value, session=self, **options)

    def invalidate(self, key: str, version: Union[int, str, None], **options: Any) -> Published:
        """`Client.invalidate` in this session."""
        return self._client.invalidate(key, version, session=self, **options)


class Client:
    """A client of one hotsplit instance's Redis door (`[resp] listen`).

    Every keyword argument goes to `redis.Redis` (host, port, password, username, ssl,
    ssl_ca_certs, protocol, socket_timeout, ...), or pass `redis=` a client of your own.
    """

    def __init__(self, redis_client: Optional[redis.Redis] = None, **settings: Any):
        self.redis = redis_client if redis_client is not None else redis.Redis(**settings)

    @classmethod
    def from_url(cls, url: str, **settings: Any) -> "Client":
        """A client for `redis://[user:password@]host:port` or `rediss://…` (TLS)."""
        return cls(redis.Redis.from_url(url, **settings))

    def session(self, token: Optional[str] = None, client_id: Optional[str] = None,
                read_class: Optional[str] = None) -> Session:
        """A new scope, starting from `token` when given (one handed over by another service)."""
        return Session(self, token=token, client_id=client_id, read_class=read_class)

    def _call(self, args: List[Any], session: Optional[Session]) -> Any:
        sent: List[str] = []
        if session is not None:
            sent = session._sent()
            args = args + ["SESSION"] + sent
        try:
            reply = self.redis.execute_command(*args)
        except redis.RedisError as error:
            raise from_redis(error) from error
        if session is not None and reply is not None:
            session._keep(sent, _fields(reply).get("session"))
        return reply

    def read(self, key: str, *, session: Optional[Session] = None,
             read_class: Optional[str] = None, min_version: Optional[int] = None,
             client_id: Optional[str] = None, meta: bool = False) -> Union[Optional[bytes], Read]:
        """Reads `key`: its value (`None` when missing), or with `meta=True` a `Read`.

        `read_class`, `min_version` and `client_id` are for this call only (a session's own
        `client_id` and `read_class` otherwise). Raises the typed error of the door's answer.
        """
        args: List[Any] = ["HOTSPLIT.READ", key]
        read_class = read_class or (session.read_class if session else None)
        client_id = client_id or (session.client_id if session else None)
        if read_class:
            args += ["CLASS", read_class]
        if min_version is not None:
            args += ["MINVERSION", str(min_version)]
        if client_id:
            args += ["CLIENT", client_id]
        reply = self._call(args, session)
        fields = _fields(reply) if reply is not None else {}
        value = fields.get("value")
        if isinstance(value, str):
            value = value.encode()
        if not meta:
            return value
        return Read(
            value=value,
            version=_int(fields.get("version")),
            copy=_int(fields.get("copy")),
            served_by=_text(fields.get("served_by")),
            route=_text(fields.get("route")),
            age_ms=_int(fields.get("age_ms")),
        )

    def publish(self, key: str, version: Union[int, str, None], value: Value, *,
                session: Optional[Session] = None,
                sync: Optional[Sequence[int]] = None) -> Published:
        """Publishes `value` at `version` (`None`: `*`, the family allocates it). `sync=(replicas,
        timeout_ms)` waits for replicas. A refused publish (`stale`, `conflict`) is a report."""
        args: List[Any] = ["HOTSPLIT.PUBLISH", key, "*" if version is None else str(version), value]
        if sync is not None:
            args += ["SYNC", str(sync[0]), str(sync[1])]
        return self._report(self._call(args, session))

    def invalidate(self, key: str, version: Union[int, str, None], *,
                   session: Optional[Session] = None) -> Published:
        """Invalidates `key` at `version` (`None`: `*`)."""
        args: List[Any] = ["HOTSPLIT.INVALIDATE", key, "*" if version is None else str(version)]
        return self._report(self._call(args, session))

    @staticmethod
    def _report(reply: Any) -> Published:
        fields = _fields(reply)
        counts = {
            name: int(fields[name])
            for name in ("copies", "applied", "current", "stale", "conflict", "failed",
                         "queued", "dropped")
            if name in fields
        }
        return Published(
            key=_text(fields.get("key")) or "",
            version=int(fields.get("version") or 0),
            status=_text(fields.get("status")) or "",
            http_status=int(fields.get("http_status") or 0),
            counts=counts,
        )

    def close(self) -> None:
        """Closes the connections underneath."""
        self.redis.close()
