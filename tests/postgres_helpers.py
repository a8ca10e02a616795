"""A real PostgreSQL server for the live-database tests: Debian's `postgresql` binaries
(/usr/lib/postgresql/*/bin; .ci/run installs them), a fresh cluster in a temporary folder on a
free loopback port, started for the test session and stopped after it. PostgreSQL refuses to
run as root, so as root the cluster belongs to the `postgres` system user the package
creates. Loaded with a few Spider databases, each its own PostgreSQL database, by the repo's
converter (sqlrl/live/copy_to_postgres.py), and a least-privilege role made by the lines
docs/serving.md gives (READER_ROLE_SQL).

The superuser connects over the Unix socket (trust); every TCP connection needs a password
(scram-sha-256), so the reader's URL carries one, as a real one would.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.repo_tools import SPIDER_DIR

PG_DATABASES = ("concert_singer", "pets_1", "world_1")  # world_1: the largest tables
READER = "sqlrl_reader"
READER_PASSWORD = "s3cret-Reader-pw"
SUPERUSER = "sqlrl_admin"
# docs/serving.md's lines, your_db and change-me filled in (tests/serve/test_docs checks they match)
READER_ROLE_SQL = """\
CREATE ROLE sqlrl_reader LOGIN PASSWORD 'change-me' NOSUPERUSER NOCREATEDB NOCREATEROLE;
ALTER ROLE sqlrl_reader SET default_transaction_read_only = on;
ALTER ROLE sqlrl_reader SET statement_timeout = '5s';
GRANT CONNECT ON DATABASE your_db TO sqlrl_reader;
GRANT USAGE ON SCHEMA public TO sqlrl_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO sqlrl_reader;
"""


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder, None where there is none."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    bin: Path
    root: Path
    port: int
    user: str | None  # the system user the cluster runs as (root cannot)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    def admin_url(self, db: str = "postgres") -> str:
        """The superuser, over the Unix socket."""
        return f"postgresql://{SUPERUSER}@/{db}?host={self.socket_dir}&port={self.port}"

    def reader_url(self, db: str) -> str:
        """The least-privilege role, over TCP with its password."""
        return f"postgresql://{READER}:{READER_PASSWORD}@127.0.0.1:{self.port}/{db}"

    def admin(self, db: str = "postgres"):
        import psycopg

        return psycopg.connect(self.admin_url(db), autocommit=True)

    def load_spider(self, db_id: str) -> None:
        """`db_id` from the Spider folder into a PostgreSQL database of the same name, with
        the reader role's grants."""
        from sqlrl.live.copy_to_postgres import copy_database

        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{db_id}"')
        with self.admin(db_id) as conn:
            conn.autocommit = False
            copy_database(SPIDER_DIR / "database" / db_id / f"{db_id}.sqlite", conn)
        with self.admin(db_id) as conn:
            for line in reader_grants(db_id).splitlines():
                if line.startswith("GRANT"):
                    conn.execute(line)

    def checksums(self, db: str) -> dict[str, str]:
        """Every relation of `db` (any schema but the catalogs) -> the md5 of its rows: a
        write, a new table (SELECT ... INTO) or a dropped one changes it."""
        with self.admin(db) as conn:
            names = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'v', 'm', 'p', 'S') "
                "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
                "AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2"
            ).fetchall()
            out = {}
            for schema, name in names:
                q = f'"{schema}"."{name}"'
                out[f"{schema}.{name}"] = conn.execute(
                    f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) "
                    f"FROM {q} t"
                ).fetchone()[0]
            return out


def reader_grants(db: str) -> str:
    return READER_ROLE_SQL.replace("your_db", f'"{db}"').replace("change-me", READER_PASSWORD)


@contextlib.contextmanager
def postgres_server(databases=PG_DATABASES):
    """A started cluster with `databases` loaded and the reader role; stopped after."""
    pg_bin = postgres_bin()
    assert pg_bin is not None
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="sqlrl-pg-"))
    if user:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server = PostgresServer(pg_bin, root, free_port(), user)
    started = False
    try:
        server.run(
            "initdb",
            "-D",
            str(root / "data"),
            "-U",
            SUPERUSER,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        socket_dir = server.socket_dir
        socket_dir.mkdir()
        if user:
            os.chown(socket_dir, entry.pw_uid, entry.pw_gid)
        options = (
            f"-p {server.port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c synchronous_commit=off -c shared_buffers=32MB"
        )
        server.run(
            "pg_ctl",
            "-D",
            str(root / "data"),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        started = True
        with server.admin() as conn:
            for line in reader_grants("postgres").splitlines():
                if not line.startswith("GRANT"):  # the role; its grants go per database
                    conn.execute(line)
        for db in databases:
            server.load_spider(db)
        yield server
    finally:
        if started:
            server.run("pg_ctl", "-D", str(root / "data"), "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)
