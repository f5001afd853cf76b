"""A PostgreSQL store's address and connection errors, said in one line without the password."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..core.errors import StoreError


def parse_url(url: str) -> dict[str, str | int | None]:
    """The connection parameters; a parse error is reported without echoing the URL."""
    try:
        return conninfo_to_dict(url)
    except psycopg.Error:
        # psycopg's message quotes fragments of the URL, which may include the password.
        raise StoreError(
            "the --store URL is not a valid PostgreSQL address — expected "
            "postgresql://user:password@host:port/database (percent-encode special characters)"
        ) from None


def location_of(params: Mapping[str, object]) -> str:
    """The address for messages: user, host, port and database, never the password."""
    user = params.get("user")
    host = str(params.get("host") or params.get("hostaddr") or "")
    if ":" in host and not host.startswith("/") and "," not in host:
        host = f"[{host}]"
    port = params.get("port")
    dbname = params.get("dbname")
    return (
        "postgresql://"
        + (f"{user}@" if user else "")
        + host
        + (f":{port}" if port else "")
        + (f"/{dbname}" if dbname else "")
    )


def one_line(exc: BaseException, secret: str) -> str:
    """The first line of an error, without libpq's prefixes and never with the password."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    line = line.removeprefix("connection failed: ")
    if " failed: " in line and line.startswith("connection to server"):
        line = line.split(" failed: ", 1)[1]
    line = line.removeprefix("FATAL:").strip()
    if secret:
        line = line.replace(secret, "***")
    return line


def connect_message(location: str, exc: psycopg.Error, secret: str) -> str:
    """One line naming why the server could not be reached and what to check."""
    text = str(exc)
    reason = one_line(exc, secret)
    if "password authentication failed" in text:
        hint = "check the password in --store"
    elif "no password supplied" in text:
        reason, hint = "the server requires a password", "add it to --store"
    elif "Connection refused" in text:
        reason, hint = "connection refused", "is the server running? check --store"
    elif isinstance(exc, psycopg.errors.ConnectionTimeout) or "timeout expired" in text:
        reason = "connection timed out"
        hint = "is the host reachable and the port right? check --store"
    elif "database" in text and "does not exist" in text:
        hint = "create it (createdb) or check the database name in --store"
    elif "role" in text and "does not exist" in text:
        hint = "check the user in --store"
    elif "failed to resolve host" in text or "could not translate host name" in text:
        reason, hint = "unknown host", "check the host name in --store"
    else:
        hint = "check --store"
    return f"cannot connect to PostgreSQL at {location}: {reason} — {hint}"
