"""The read replica (issue 46) against a real streaming standby this module starts.

The standby is a second PostgreSQL 15 cluster made from the test cluster with `pg_basebackup
-R -X stream` (no replication slot: nothing is left on the shared primary), started as the
`postgres` OS user on a free port. The primary needs `wal_level` replica or logical and free
WAL senders (checked, never changed: that would need a restart) and a `replication` entry in
pg_hba.conf: `_replication_allowed` appends `host replication all 127.0.0.1/32 trust` when none
exists and reloads the configuration (`pg_reload_conf()`: no restart, running sessions keep
going), once; it says so on stderr.

What is shown: the public API's GETs and the console's lists read the standby (statements
counted in the standby's own `pg_stat_database`), writes stay on the primary; right after a
trigger its writer reads it back (the pin cookie) while another client, served by the paused
standby, does not see it yet; above the lag bound reads fall back to the primary; the standby
stopped, reads fall back (one failed attempt, retried on the primary) and nothing fails.
"""

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from assets_app.api.public_auth import create_api_token
from assets_app.models import Dag, DagRun
from assets_app.sql import replica
from tests.conftest import record_figure
from tests.factories import DagFactory, DagRunFactory, TaskFactory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("read_replica"),
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PRIMARY_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
REPLICATION_RULE = "host replication all 127.0.0.1/32 trust"
URL = "/api/v2/dags/report/dagRuns"


def _as_postgres(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + args, check=True, capture_output=True, text=True, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replication_allowed() -> None:
    with psycopg.connect(PRIMARY_DSN, autocommit=True) as conn:
        wal_level = conn.execute("SHOW wal_level").fetchone()[0]
        senders = int(conn.execute("SHOW max_wal_senders").fetchone()[0])
        if wal_level not in ("replica", "logical") or senders < 3:
            pytest.fail(
                f"the primary needs wal_level=replica and max_wal_senders >= 3 (has {wal_level}, "
                f"{senders}): a restart, which this test never does"
            )
        rules = conn.execute(
            "SELECT count(*) FROM pg_hba_file_rules WHERE 'replication' = ANY(database)"
            " AND auth_method = 'trust' AND (type = 'local' OR address = '127.0.0.1')"
        ).fetchone()[0]
        if rules:
            return
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        if REPLICATION_RULE not in hba.read_text():
            print(f"read replica test: adding '{REPLICATION_RULE}' to {hba}", file=sys.stderr)
            with hba.open("a") as out:
                out.write(f"# tests/test_read_replica.py (issue 46)\n{REPLICATION_RULE}\n")
        conn.execute("SELECT pg_reload_conf()")
    for _ in range(50):
        probe = subprocess.run(
            [str(PG_BIN / "psql"), "-Atc", "IDENTIFY_SYSTEM",
             "host=127.0.0.1 user=postgres replication=database dbname=postgres"],
            capture_output=True,
        )  # fmt: skip
        if probe.returncode == 0:
            return
        time.sleep(0.1)
    pytest.fail("the primary still refuses replication connections after pg_reload_conf()")


class Standby:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def start(self) -> None:
        _as_postgres(
            [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
             "-o", f"-p {self.port} -k {self.root}", "-w", "start"]
        )  # fmt: skip

    def stop(self) -> None:
        _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def execute(self, sql: str, *params):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql, params).fetchone()

    def caught_up(self) -> None:
        """Waits until the standby replayed everything the primary had written."""
        with psycopg.connect(PRIMARY_DSN, autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.monotonic() + 30
        while not self.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", target)[0]:
            assert time.monotonic() < deadline, "the standby did not catch up in 30 s"
            time.sleep(0.05)

    def commits(self, database: str) -> int:
        return self.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", database
        )[0]


def _drop_slot(name: str) -> None:
    """Drops this module's replication slot once its standby is gone (a slot left behind would
    keep WAL on the shared primary for ever)."""
    with psycopg.connect(PRIMARY_DSN, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
        ).fetchone() == (True,):
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND NOT active",
            (name,),
        )


def _base_backup(node: Standby, slot: str) -> None:
    """pg_basebackup of the shared primary into `node.data`, with its slot. One fresh-clone CI
    run saw it exit 1 (its message was not kept); a failure now shows pg_basebackup's own
    message, and a second attempt is made once, after the copy and the slot are removed, so
    a moment of the shared cluster (other sessions create and drop databases) is not a
    failure while a reproducible one still fails with both messages."""
    errors = []
    for _ in range(2):
        try:
            _as_postgres(
                [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-U", "postgres",
                 "-D", str(node.data), "-R", "-X", "stream", "-c", "fast", "-N", "-C", "-S",
                 slot]
            )  # fmt: skip
            return
        except subprocess.CalledProcessError as exc:
            errors.append(exc.stderr.strip())
            shutil.rmtree(node.data, ignore_errors=True)
            _drop_slot(slot)
            time.sleep(2)
    pytest.fail(f"pg_basebackup failed twice: {errors}")


@pytest.fixture(scope="module")
def standby(django_db_setup, django_db_blocker):
    _replication_allowed()
    root = Path(tempfile.mkdtemp(prefix="ae-standby-"))
    shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    node = Standby(root, _free_port())
    # A slot of its own (named after this session's test database): the primary keeps the WAL
    # between the backup and the standby's start, when other sessions' checkpoints would remove
    # it. A slot a killed run left behind is dropped here first.
    slot = "ae_standby_" + "".join(
        c if c.isalnum() else "_" for c in connections["default"].settings_dict["NAME"]
    )
    _drop_slot(slot)
    with psycopg.connect(PRIMARY_DSN, autocommit=True) as conn:
        limits = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("max_connections", "max_worker_processes", "max_wal_senders",
                         "max_locks_per_transaction", "max_prepared_transactions")
        }  # fmt: skip
    try:
        # -c fast: the backup's checkpoint at once (a spread one can take minutes); -N and
        # fsync off: a throwaway copy skips the minute of fsyncs a crash-safe one needs.
        _base_backup(node, slot)
        # Debian keeps the configuration under /etc: the copy gets its own, small one (the
        # standby's limits may not be below the primary's).
        conf = [
            "listen_addresses = '127.0.0.1'",
            "hot_standby = on",
            "fsync = off",
            "shared_buffers = '16MB'",
            *(f"{name} = {value}" for name, value in limits.items()),
        ]
        (node.data / "postgresql.conf").write_text("\n".join(conf) + "\n")
        (node.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        )
        (node.data / "pg_ident.conf").write_text("")
        for name in ("postgresql.conf", "pg_hba.conf", "pg_ident.conf"):
            shutil.chown(node.data / name, "postgres", "postgres")
        node.start()
        assert node.execute("SELECT pg_is_in_recovery()")[0]
        yield node
    finally:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(node.data),
             "-m", "immediate", "-w", "stop"],
            capture_output=True,
        )  # fmt: skip
        _drop_slot(slot)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def replica_alias(standby):
    """The `replica` alias on the standby (the same test database). Module-scoped so that it
    exists before each test's database set-up, which then allows it (`databases` below); a
    mirror of `default`, so a test's flush leaves the read-only standby alone."""
    config = copy.deepcopy(connections["default"].settings_dict)
    config.update(HOST="127.0.0.1", PORT=standby.port)
    config["TEST"] = {**config.get("TEST", {}), "MIRROR": "default"}
    config.get("OPTIONS", {}).pop("pool", None)
    connections.settings[replica.REPLICA] = config
    try:
        yield connections[replica.REPLICA]
    finally:
        connections[replica.REPLICA].close()
        del connections[replica.REPLICA]
        del connections.settings[replica.REPLICA]


@pytest.fixture(autouse=True)
def routed(replica_alias, settings):
    """The router installed, the lag looked at on every request."""
    settings.DATABASE_ROUTERS = ["assets_app.sql.routers.ReplicaRouter"]
    settings.DATABASE_REPLICA_CHECK_SECONDS = 0.0
    settings.DATABASE_REPLICA_MAX_LAG_SECONDS = 60.0
    replica.forget()
    yield
    replica_alias.close()
    replica.forget()


@pytest.fixture
def key():
    get_user_model().objects.create_user("ops", password="pw", is_staff=True, is_superuser=True)
    dag = DagFactory(dag_id="report", is_paused=False)
    TaskFactory(dag=dag, task_id="extract")
    for _ in range(3):
        DagRunFactory(dag=dag)
    _, key = create_api_token(username="ops", name="test")
    return key


def _run_ids(client: Client, key: str) -> set[str]:
    response = client.get(URL, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.content
    return {r["dag_run_id"] for r in response.json()["dag_runs"]}


def _data_queries(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "assets_app_dagrun" in q["sql"]]


def test_reads_land_on_the_standby_and_writes_on_the_primary(replica_alias, standby, key):
    standby.caught_up()
    database = connections["default"].settings_dict["NAME"]
    replica_alias.close()
    before = standby.commits(database)
    client = Client()
    client.force_login(get_user_model().objects.get(username="ops"))
    with (
        CaptureQueriesContext(replica_alias) as on_replica,
        CaptureQueriesContext(connections["default"]) as on_primary,
    ):
        assert len(_run_ids(client, key)) == 3
        assert client.get("/admin/assets_app/dagrun/").status_code == 200
        assert client.get("/admin/assets_app/dag/lineage/").status_code == 200
        assert client.get("/admin/assets_app/dag/report/grid/").status_code == 200
    assert _data_queries(on_replica), "the run reads went to the primary"
    assert not _data_queries(on_primary), _data_queries(on_primary)
    # The standby's own count: its backend's statistics are written when it ends.
    replica_alias.close()
    deadline = time.monotonic() + 10
    while standby.commits(database) - before < len(on_replica.captured_queries):
        assert time.monotonic() < deadline, (standby.commits(database) - before, on_replica)
        time.sleep(0.1)
    record_figure(
        f"read replica: 4 pages, {len(on_replica.captured_queries)} statements on the standby"
        f" (its pg_stat_database xact_commit +{standby.commits(database) - before}),"
        f" {len(on_primary.captured_queries)} on the primary, none of them reading runs"
    )

    # A write (the trigger) goes to the primary, and its writer is pinned there.
    with CaptureQueriesContext(replica_alias) as on_replica:
        response = client.post(
            URL, data="{}", content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )  # fmt: skip
    assert response.status_code == 200, response.content
    assert on_replica.captured_queries == []
    assert replica.PIN_COOKIE in response.cookies
    assert DagRun.objects.filter(dag_id="report").count() == 4


def test_read_your_writes_after_a_trigger_while_the_standby_lags(replica_alias, standby, key):
    standby.caught_up()
    standby.execute("SELECT pg_wal_replay_pause()")
    try:
        writer, other = Client(), Client()
        response = writer.post(
            URL, data="{}", content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )  # fmt: skip
        assert response.status_code == 200, response.content
        run_id = response.json()["dag_run_id"]
        # The writer reads its run at once (pinned to the primary), in the same second ...
        with CaptureQueriesContext(replica_alias) as on_replica:
            assert run_id in _run_ids(writer, key)
        assert not _data_queries(on_replica)
        # ... while a client that did not write is served by the paused standby: not yet there.
        assert run_id not in _run_ids(other, key)
        assert len(_run_ids(other, key)) == 3

        # Above the lag bound every client reads the primary; /healthz and the dashboard say so.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("django.conf.settings.DATABASE_REPLICA_MAX_LAG_SECONDS", 0.0)
            assert run_id in _run_ids(other, key)
            health = json.loads(Client().get("/healthz").content)["replica"]
            assert health["status"] == "lagging"
            assert health["lag_seconds"] > 0
            other.force_login(get_user_model().objects.get(username="ops"))
            page = other.get("/admin/dashboard/").content.decode()
            assert 'id="replica"' in page and "lagging" in page
    finally:
        standby.execute("SELECT pg_wal_replay_resume()")
    standby.caught_up()
    with CaptureQueriesContext(replica_alias) as on_replica:
        assert run_id in _run_ids(other, key)
    assert _data_queries(on_replica)
    assert json.loads(Client().get("/healthz").content)["replica"]["status"] == "ok"


def test_a_write_in_the_request_pins_its_later_reads(replica_alias, standby, key):
    standby.caught_up()

    def read_write_read():
        first = Dag.objects.all().db
        Dag.objects.filter(dag_id="report").update(is_paused=True)
        return first, Dag.objects.all().db

    def read_in_transaction_lock():
        with transaction.atomic():
            in_transaction = Dag.objects.all().db
        after = Dag.objects.all().db
        # A lock is a write: on the primary, and it pins what follows too.
        return in_transaction, after, Dag.objects.select_for_update().db, Dag.objects.all().db

    assert replica.run_reads(read_write_read, pinned=False) == (
        replica.REPLICA,
        replica.PRIMARY,
    )
    assert replica.run_reads(read_in_transaction_lock, pinned=False) == (
        replica.PRIMARY,
        replica.REPLICA,
        replica.PRIMARY,
        replica.PRIMARY,
    )
    assert Dag.objects.get(dag_id="report").is_paused


def test_the_standby_stopped_reads_fall_back_and_nothing_fails(replica_alias, standby, key):
    standby.caught_up()
    client = Client()
    client.force_login(get_user_model().objects.get(username="ops"))
    # The replica looked healthy a moment ago (the look is kept for a minute) ...
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("django.conf.settings.DATABASE_REPLICA_CHECK_SECONDS", 60.0)
        patch.setattr("django.conf.settings.DATABASE_REPLICA_RETRY_SECONDS", 60.0)
        assert len(_run_ids(client, key)) == 3
        assert replica.status().state == "ok"
        # Last in the module: its teardown removes the stopped standby.
        standby.stop()
        # ... its connection fails under the view: retried on the primary, 200.
        assert len(_run_ids(client, key)) == 3
        assert replica.status().state == "unreachable"
        # Marked down: no further attempt to connect while the retry interval lasts.
        attempts = []
        connect = replica_alias.get_new_connection
        patch.setattr(
            replica_alias, "get_new_connection", lambda p: attempts.append(p) or connect(p)
        )
        assert len(_run_ids(client, key)) == 3
        assert client.get("/admin/assets_app/dagrun/").status_code == 200
        assert client.get("/admin/assets_app/dag/report/grid/").status_code == 200
        assert attempts == []
        health = json.loads(Client().get("/healthz").content)["replica"]
        assert health["status"] == "unreachable" and health["error"]
