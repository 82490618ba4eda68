"""schemathesis hooks for hotsplit: a check that every 400 answered to a schema-valid request
on /v1/keys/{key} is one the deployment's configuration explains (see schemathesis.toml).

The instance runs hotsplit.toml: one caller-versioned default family of 1024 copies, the
built-in read classes, and no replicas known (the embedded store, or a standalone Redis without
replicas).
"""

import re
from urllib.parse import unquote

import schemathesis

# The classes a read may name on the test instance. `decides-on-presence` exists but is
# refused on its split family (class_not_allowed).
ALLOWED_CLASSES = {"advisory", "re-derivable", "primary"}


def _header(case, name):
    for key, value in (case.headers or {}).items():
        if key.lower() == name:
            return value
    return None


# The key's documented constraints (OpenAPI: 1..=512 bytes of this pattern, after decoding).
KEY_PATTERN = re.compile(r'^[!-"$-z|~]{1,512}$')


def _valid_key(key):
    """Whether `key`, and its percent-decoding, both match the documented pattern."""
    try:
        decoded = unquote(key, errors="strict")
    except UnicodeDecodeError:
        return False
    return bool(KEY_PATTERN.match(key) and KEY_PATTERN.match(decoded))


def _explains(case, code):
    """Whether the request and the configuration explain a 400 with `code`."""
    # The stateful phase can carry a key from an earlier request into a later one without
    # checking it against the schema (seen: a key holding 0x10); such a request is not
    # schema-valid, and invalid_key is its right answer.
    # It may hold the key as sent, percent-encoded (seen: `%5Cn-%5D%3D%2A%10%3B%5BNv%26`, whose
    # escapes all match the pattern), so its decoding is checked too.
    key = (case.path_parameters or {}).get("key")
    if code == "invalid_key" and isinstance(key, str) and not _valid_key(key):
        return True
    query = case.query or {}
    method = case.method.upper()
    if method in ("PUT", "DELETE"):
        # The default family takes versions from the caller.
        if code == "invalid_version" and "version" not in query:
            return True
        # No replicas are known, so every replica wait is refused; one of the pair alone is too.
        if method == "PUT" and code == "invalid_parameter" and (
            "sync_replicas" in query or "sync_timeout_ms" in query
        ):
            return True
        return False
    if method == "GET":
        client = query.get("client", _header(case, "hotsplit-client"))
        if code == "missing_client" and "copy" not in query and not client:
            return True
        named = query.get("class", _header(case, "hotsplit-read-class"))
        if code == "unknown_class" and named is not None and named not in ALLOWED_CLASSES | {"decides-on-presence"}:
            return True
        if code == "class_not_allowed" and named == "decides-on-presence":
            return True
    return False


@schemathesis.check
def hotsplit_refusals_are_explained(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code != 400 or case.operation.path != "/v1/keys/{key}":
        return None
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    if not _explains(case, code):
        raise AssertionError(
            f"a schema-valid request was refused with 400 {code!r}, which neither the request nor hotsplit.toml explains"
        )
    return None
