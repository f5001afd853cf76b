"""A real, throw-away PostgreSQL server for tests and benchmarks, from the system binaries."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

#: The unprivileged account that runs the server when we are root (PostgreSQL refuses root).
SERVER_USER = "postgres"
ROLE = "orchmode"
DATABASE = "orchmode"
START_TIMEOUT = 30
#: How many fresh ports to try when another program takes ours between probe and bind.
PORT_ATTEMPTS = 3


class PostgresUnavailable(RuntimeError):
    """The server binaries (or an account to run them) are missing on this machine."""


def postgres_bindir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: pg_config, then Debian's layout, PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    # Debian installs the server outside PATH; prefer the newest major version.
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(Path(p) for p in debian)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise PostgresUnavailable(
        "PostgreSQL server binaries not found — install the Debian package postgresql"
    )


@dataclass
class PostgresServer:
    """A private server that a test may stop and start again (same data, same port)."""

    bindir: Path
    root: Path
    port: int
    url: str
    as_server_user: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def options(self) -> str:
        sockets = shlex.quote(str(self.root / "sockets"))
        return f"-p {self.port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=on"

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``, waiting until it is down (``fast``: clients are cut off)."""
        _run(
            "pg_ctl stop",
            [*self.as_server_user, str(self.bindir / "pg_ctl"), "-D", str(self.data),
             "-m", mode, "-w", "-t", str(START_TIMEOUT), "stop"],
            cwd=self.root,
        )  # fmt: skip

    def start(self) -> None:
        """``pg_ctl start``, waiting until it accepts connections."""
        _run(
            "pg_ctl start",
            [*self.as_server_user, str(self.bindir / "pg_ctl"), "-D", str(self.data),
             "-l", str(self.root / "server.log"), "-w", "-t", str(START_TIMEOUT),
             "-o", self.options(), "start"],
            cwd=self.root,
        )  # fmt: skip


@contextmanager
def postgres_server(*, port: int | None = None) -> Iterator[str]:
    """Run a private server on 127.0.0.1 with password authentication; yield its DSN.

    The DSN is ``postgresql://orchmode:<password>@127.0.0.1:<port>/orchmode``: a login role
    that owns its database but is not a superuser, like a real deployment. Everything lives
    in a temporary directory that is removed on exit, after an immediate stop.
    """
    with postgres_instance(port=port) as server:
        yield server.url


@contextmanager
def postgres_instance(*, port: int | None = None) -> Iterator[PostgresServer]:
    """:func:`postgres_server`, yielding the server itself (to stop and start it again)."""
    bindir = postgres_bindir()
    as_server_user = _user_switch()
    root = Path(tempfile.mkdtemp(prefix="orchmode-pg-"))
    data, sockets = root / "data", root / "sockets"
    try:
        sockets.mkdir()
        superuser_password = secrets.token_urlsafe(24)
        password_file = root / "superuser-password"
        password_file.write_text(superuser_password + "\n")
        if as_server_user:
            for path in (root, sockets, password_file):
                shutil.chown(path, SERVER_USER, SERVER_USER)
        _run(
            "initdb",
            [
                *as_server_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                f"--pwfile={password_file}", "-A", "scram-sha-256", "-E", "UTF8",
                "--locale=C", "--no-instructions",
            ],
            cwd=root,
        )  # fmt: skip
        password_file.unlink()
        server = PostgresServer(bindir, root, 0, "", as_server_user)
        for attempt in range(1 if port is not None else PORT_ATTEMPTS):
            server.port = port if port is not None else _free_port()
            try:
                server.start()
            except RuntimeError:
                if attempt + 1 >= PORT_ATTEMPTS or port is not None:
                    raise
                continue
            break
        password = secrets.token_urlsafe(18)
        _create_role_and_database(server.port, superuser_password, password)
        server.url = f"postgresql://{ROLE}:{password}@127.0.0.1:{server.port}/{DATABASE}"
        yield server
    finally:
        if (data / "postmaster.pid").exists():  # also after a start that timed out
            subprocess.run(
                [*as_server_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                 "-w", "stop"],
                cwd=root, capture_output=True, timeout=START_TIMEOUT, check=False,
            )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def reset_database(dsn: str) -> None:
    """Drop every table in schema public (schema_migrations too), so a test starts empty."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        tables = [
            row[0]
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        if tables:
            names = sql.SQL(", ").join(sql.Identifier("public", t) for t in tables)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(names))


def _user_switch() -> list[str]:
    """The command prefix that runs a server binary as an unprivileged user (none if we are)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"PostgreSQL cannot run as root and there is no {SERVER_USER!r} system user — "
            "install the Debian package postgresql"
        ) from None
    # setpriv switches user without a PAM session: nothing to log in, nothing to print.
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--"]
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", SERVER_USER, "--"]
    raise PostgresUnavailable(
        "running as root needs setpriv or runuser (util-linux) to start PostgreSQL as "
        f"{SERVER_USER!r} — install util-linux"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _run(what: str, command: Sequence[str], *, cwd: Path) -> None:
    """Run a server tool; on failure raise with its output (and the server log) attached."""
    env = {**os.environ, "LC_ALL": "C"}
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=START_TIMEOUT * 2
    )
    if done.returncode != 0:
        log = cwd / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(
            f"{what} failed (exit {done.returncode}): {done.stdout}{done.stderr}{tail}".strip()
        )


def _create_role_and_database(port: int, superuser_password: str, password: str) -> None:
    """Create the non-superuser login role and the database it owns, over TCP as postgres."""
    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        password=superuser_password,
        dbname="postgres",
        autocommit=True,
        connect_timeout=5,
    ) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(ROLE), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(DATABASE), sql.Identifier(ROLE)
            )
        )
