"""A real PostgreSQL on loopback for the store tests: Debian's ``postgresql`` binaries
(/usr/lib/postgresql/*/bin), a fresh cluster (initdb) in a temp dir, trust authentication on 127.0.0.1
only, a free port. PostgreSQL refuses to run as root (CI runs as root), so there the server runs as the
unprivileged ``nobody``. Readiness is polled, never slept; every test gets its own database."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from act_support import free_port, wait_until


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4])
                   if p.split("/")[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    p = shutil.which("postgres")
    return Path(p).parent if p else None


def skip_reason() -> str | None:
    if pg_bin() is None:
        return "PostgreSQL not installed (apt-get install postgresql; scripts/install-deps does it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg not installed (pip install 'psycopg[binary]')"
    return None


class Postgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fh-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "nobody" if os.geteuid() == 0 else None

    @property
    def base_url(self) -> str:
        return f"postgresql://fleethealth@127.0.0.1:{self.port}"

    def _run(self, args: list[str]) -> None:
        subprocess.run(args, check=True, capture_output=True, user=self.user, timeout=120)

    def start(self) -> Postgres:
        b = pg_bin()
        assert b is not None
        data = self.dir / "data"
        if self.user is not None:
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, self.user)
        self._run([str(b / "initdb"), "-D", str(data), "-U", "fleethealth", "--auth=trust", "-E", "UTF8",
                   "--no-sync", "--no-instructions"])
        log = (self.dir / "postgres.log").open("wb")
        self.proc = subprocess.Popen(
            [str(b / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.dir),
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=60", "-c", "shared_buffers=32MB"],
            stdout=log, stderr=subprocess.STDOUT, user=self.user)

        def ready() -> bool:
            import psycopg

            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("postgres exited:\n" + self.log())
            with psycopg.connect(self.base_url + "/postgres", connect_timeout=2):
                return True

        wait_until(ready, 60, 0.05, what="postgres accepting connections")
        return self

    def log(self) -> str:
        f = self.dir / "postgres.log"
        return f.read_text(errors="replace")[-3000:] if f.exists() else ""

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.base_url + "/postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return f"{self.base_url}/{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: clients left connected are disconnected
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
