"""Operator actions go through the domain functions and report what they did."""

import re

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from assets_app.models import AssetDagRunQueue, AssetEventQueue, AuditEntry
from tests.factories import (
    AssetAliasFactory,
    AssetEventFactory,
    AssetEventQueueFactory,
    AssetFactory,
    DagFactory,
)

OUTBOX = reverse("admin:assets_app_asseteventqueue_changelist")
ADRQ = reverse("admin:assets_app_assetdagrunqueue_changelist")


def outlets(n):
    return [{"name": f"o{i}", "uri": f"s3://o{i}", "type": "Asset"} for i in range(n)]


def parked_row(n_outlets=2, **kwargs):
    row = AssetEventQueueFactory(parked=True, **kwargs)
    row.payload = {**row.payload, "outlets": outlets(n_outlets)}
    row.save(update_fields=["payload"])
    return row


def texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_requeue_now_resets_parked_rows_and_reports(staff_client):
    rows = [parked_row(), parked_row()]
    other = parked_row()
    response = staff_client.post(
        OUTBOX,
        {"action": "requeue_now", "_selected_action": [r.pk for r in rows]},
        follow=True,
    )
    assert texts(response) == [f"Requeued 2 outbox row(s): {rows[0].pk}, {rows[1].pk}."]
    for row in rows:
        row.refresh_from_db()
        assert (row.parked_at, row.attempts) == (None, 0)
        assert row.next_attempt_at <= timezone.now()
    other.refresh_from_db()
    assert other.parked_at is not None and other.attempts == 10


def test_park_reports_rows_left_alone(staff_client):
    pending = AssetEventQueueFactory()
    already = parked_row()
    response = staff_client.post(
        OUTBOX,
        {"action": "park_rows", "_selected_action": [pending.pk, already.pk]},
        follow=True,
    )
    assert texts(response) == [
        f"Parked 1 outbox row(s): {pending.pk}.",
        "1 selected row(s) were left alone: already parked, or held by a drain.",
    ]
    pending.refresh_from_db()
    assert pending.parked_at is not None


def confirm_form(page: str) -> dict:
    """The hidden fields of the confirmation page's form, as a browser would post them."""
    form = page[page.index('<form method="post">') :]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))


def test_delete_asks_for_confirmation_with_the_outlets_lost_then_deletes(staff_client):
    rows = [parked_row(n_outlets=3), parked_row(n_outlets=2)]
    ids = [r.pk for r in rows]
    confirm = staff_client.post(OUTBOX, {"action": "delete_outbox_rows", "_selected_action": ids})
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Delete <strong>2</strong> outbox rows?" in page
    assert '<strong id="outlets-lost">5</strong> declared outlets will <strong>never' in page
    assert AssetEventQueue.objects.count() == 2

    done = staff_client.post(OUTBOX, confirm_form(page), follow=True)
    assert texts(done) == [
        "Deleted 2 outbox row(s); 5 declared outlet(s) will never be registered as asset events."
    ]
    assert AssetEventQueue.objects.count() == 0
    entry = AuditEntry.objects.get()
    assert (entry.actor_name, entry.via, entry.action, entry.row_count) == (
        "operator",
        "admin",
        "outbox.delete",
        2,
    )
    assert sorted(entry.targets.values_list("ti_id", flat=True)) == sorted(r.ti_id for r in rows)


def test_delete_across_all_filtered_rows_deletes_exactly_the_rows_confirmed(staff_client):
    for _ in range(3):
        parked_row(n_outlets=1)
    pending = AssetEventQueueFactory()
    url = OUTBOX + "?status=parked"
    one = AssetEventQueue.objects.filter(parked_at__isnull=False).first().pk
    post = {"action": "delete_outbox_rows", "_selected_action": [one], "select_across": "1"}
    confirm = staff_client.post(url, post)
    page = confirm.content.decode()
    assert "Delete <strong>3</strong> outbox rows?" in page
    shown = set(
        AssetEventQueue.objects.filter(parked_at__isnull=False).values_list("pk", flat=True)
    )
    # Two more rows park while the operator reads the page: they were not confirmed.
    late = [parked_row(n_outlets=1).pk, parked_row(n_outlets=1).pk]
    done = staff_client.post(url, confirm_form(page), follow=True)
    assert texts(done)[0].startswith("Deleted 3 outbox row(s)")
    assert sorted(AssetEventQueue.objects.values_list("pk", flat=True)) == sorted(
        [pending.pk, *late]
    )
    entry = AuditEntry.objects.get(action="outbox.delete")
    assert set(map(int, entry.targets.values_list("object_id", flat=True))) == shown


def test_requeue_and_park_are_audited_with_the_operator(staff_client):
    row = parked_row()
    staff_client.post(OUTBOX, {"action": "requeue_now", "_selected_action": [row.pk]})
    staff_client.post(OUTBOX, {"action": "park_rows", "_selected_action": [row.pk]})
    entries = list(AuditEntry.objects.order_by("id").values_list("actor_name", "via", "action"))
    assert entries == [
        ("operator", "admin", "outbox.requeue"),
        ("operator", "admin", "outbox.park"),
    ]
    row.refresh_from_db()
    assert row.park_reason == "Parked by operator."
    listing = staff_client.get(
        reverse("admin:assets_app_auditentry_changelist"), {"q": str(row.pk)}
    ).content.decode()
    assert "outbox.requeue" in listing and "outbox.park" in listing


def test_outbox_change_page_renders_payload_as_tables(staff_client):
    row = parked_row(n_outlets=1)
    row.payload["outlet_events"] = [
        {
            "source_alias_name": "cleaned",
            "dest_asset_key": {"name": "o9", "uri": "s3://o9"},
            "dest_asset_extra": {},
            "extra": {"rows": 12},
        }
    ]
    row.last_error = "KeyError: 'x'\nTraceback (most recent call last): ..."
    row.save()
    page = staff_client.get(
        reverse("admin:assets_app_asseteventqueue_change", args=[row.pk])
    ).content.decode()
    assert "<td>Asset</td><td>o0</td><td>s3://o0</td>" in page
    assert "<td>cleaned</td>" in page and "&quot;rows&quot;: 12" in page
    for action in ("requeue_now", "park_rows", "delete_outbox_rows"):
        assert f'name="action" value="{action}"' in page  # row page offers the list's actions
    listing = staff_client.get(OUTBOX + "?status=parked").content.decode()
    assert "KeyError: &#x27;x&#x27;</span>" in listing  # first line only
    assert "aes-badge-parked" in listing


def test_outbox_filters(staff_client):
    now = timezone.now()
    due = AssetEventQueueFactory(next_attempt_at=now)
    backing = AssetEventQueueFactory(attempts=2, next_attempt_at=now + timezone.timedelta(hours=1))
    parked = parked_row()
    AssetEventQueueFactory(source_dag_id="other", last_error_type="builtins.KeyError")

    def ids(query):
        return {r.pk for r in staff_client.get(OUTBOX + query).context["cl"].result_list}

    assert due.pk in ids("?status=due") and backing.pk not in ids("?status=due")
    assert ids("?status=backing_off") == {backing.pk}
    assert ids("?status=parked") == {parked.pk}
    assert parked.pk not in ids("?status=pending")
    assert len(ids("?source_dag_id=other")) == 1
    assert len(ids("?last_error_type=builtins.KeyError")) == 1


def make_queued(dag, asset, n):
    for _ in range(n):
        event = AssetEventFactory(asset=asset)
        AssetDagRunQueue.objects.create(target_dag=dag, asset_event=event, asset=asset)


def test_queued_events_page_shows_met_parts_and_clears(staff_client):
    a, b, c = AssetFactory(name="a", uri="a"), AssetFactory(name="b", uri="b"), AssetFactory()
    AssetAliasFactory(name="cleaned")
    dag = DagFactory(
        dag_id="report",
        schedule={
            "all": [
                {"asset": {"name": "a", "uri": "a"}},
                {"any": [{"asset": {"name": "b", "uri": "b"}}, {"alias": "cleaned"}]},
            ]
        },
    )
    make_queued(dag, a, 2)
    make_queued(dag, c, 1)
    url = reverse("admin:assets_app_dag_queued_events", args=["report"])
    page = staff_client.get(url).content.decode()
    assert (
        '<li class="aes-node aes-unmet"><span class="aes-mark">✗</span> '
        '<span class="aes-node-all">all of' in page
    )
    assert (
        '<li class="aes-node aes-met"><span class="aes-mark">✓</span> '
        '<span class="aes-node-asset">a</span>' in page
    )
    assert "alias cleaned → no assets yet" in page

    make_queued(dag, b, 1)
    page = staff_client.get(url).content.decode()
    assert "condition met" in page

    response = staff_client.post(url, {"asset_id": a.pk}, follow=True)
    assert texts(response) == ["Cleared 2 queued events of report."]
    assert set(AssetDagRunQueue.objects.values_list("asset_id", flat=True)) == {b.pk, c.pk}
    response = staff_client.post(url, follow=True)
    assert texts(response) == ["Cleared 2 queued events of report."]
    assert AssetDagRunQueue.objects.count() == 0
    assert list(
        AuditEntry.objects.order_by("id").values_list("action", "actor_name", "row_count")
    ) == [
        ("queued_events.clear", "operator", 2),
        ("queued_events.clear", "operator", 2),
    ]


@pytest.mark.parametrize(
    ("perms", "can_clear"),
    [
        (["view_dag", "change_dag"], False),
        (["view_dag", "delete_assetdagrunqueue"], True),
    ],
)
def test_dag_page_clear_needs_the_same_permission_as_the_admin_clear_action(
    db, django_user_model, perms, can_clear
):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="clerk", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    dag = DagFactory(dag_id="report", schedule={"asset": {"name": "a", "uri": "a"}})
    make_queued(dag, AssetFactory(name="a", uri="a"), 2)
    client = Client()
    client.force_login(user)
    url = reverse("admin:assets_app_dag_queued_events", args=["report"])

    page = client.get(url)
    assert page.status_code == 200
    assert ('name="asset_id"' in page.content.decode()) is can_clear
    response = client.post(url)

    assert response.status_code == (302 if can_clear else 403)
    assert AssetDagRunQueue.objects.count() == (0 if can_clear else 2)


def test_adrq_clear_action_clears_selected_dag_asset_pairs(staff_client):
    asset, other = AssetFactory(), AssetFactory()
    dag, dag2 = DagFactory(), DagFactory()
    make_queued(dag, asset, 3)
    make_queued(dag, other, 1)
    make_queued(dag2, asset, 1)
    one = AssetDagRunQueue.objects.filter(target_dag=dag, asset=asset).first()
    response = staff_client.post(
        ADRQ, {"action": "clear_selected_pairs", "_selected_action": [one.pk]}, follow=True
    )
    assert texts(response)[0].startswith("Cleared 3 queued event(s) across 1 Dag/asset pair(s)")
    assert AssetDagRunQueue.objects.count() == 2


def test_non_staff_is_sent_to_login(db, django_user_model):
    user = django_user_model.objects.create_user(username="someone", password="pw")
    client = Client()
    client.force_login(user)
    for url in (OUTBOX, reverse("asset_dashboard"), reverse("admin:index")):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    assert Client().get(reverse("asset_dashboard")).status_code == 302


def test_staff_without_permissions_sees_no_actions_and_cannot_act(db, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_asseteventqueue"))
    row = parked_row()
    client = Client()
    client.force_login(user)
    response = client.get(OUTBOX)
    assert response.status_code == 200
    assert "requeue_now" not in response.content.decode()
    client.post(OUTBOX, {"action": "requeue_now", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.parked_at is not None


def test_actions_need_a_csrf_token(db, django_user_model):
    user = django_user_model.objects.create_superuser(username="op", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    row = parked_row()
    response = client.post(OUTBOX, {"action": "requeue_now", "_selected_action": [row.pk]})
    assert response.status_code == 403
    row.refresh_from_db()
    assert row.parked_at is not None


def test_dashboard_renders_gauges_chart_and_health_with_fixed_queries(
    staff_client, django_assert_num_queries
):
    from .conftest import populate

    populate(1)
    staff_client.get(reverse("asset_dashboard"))
    # 11: issue 30's retention line reads the last clean's record (one query, flat); 13: issue
    # 29's events-out card, freshness policies and webhook messages by state (two aggregates);
    # 14: issue 28's queue watchers card (one query, however many watchers).
    with django_assert_num_queries(14):
        page = staff_client.get(reverse("asset_dashboard")).content.decode()
    assert '<div class="aes-label">Parked</div><div class="aes-value">1</div>' in page
    assert page.count('<svg class="aes-chart"') == 2
    assert "<title>" in page  # at least one bar (the events populate() created this minute)
    assert page.count('aes-badge-ok">ok</span>') == 2
    assert page.count('aes-badge-parked">1 parked</span>') == 1  # populate's parked message
    populate(5)
    with django_assert_num_queries(14):
        page = staff_client.get(reverse("asset_dashboard")).content.decode()
    assert '<div class="aes-label">Parked</div><div class="aes-value">6</div>' in page


def test_dashboard_retention_line_names_the_tables_deleted_from_and_nothing_else(staff_client):
    """The line lists the per-table counts of the last clean's summary; its other fields (the
    batches, the longest transaction, the pauses, whether it finished) are not tables."""
    from assets_app.operations import heartbeats, retention

    result = retention.CleanResult(
        dry_run=False,
        tables=retention.TABLES,
        cutoffs={},
        counts={"dag_run": 1, "task_instance": 2},
        batches=2,
        longest_transaction_ms=4.0,
        paused_seconds=0.3,
    )
    heartbeats.record(component="retention", ok=True, detail=result.summary())
    page = staff_client.get(reverse("asset_dashboard")).content.decode()
    line = re.search(r'<p id="retention-last">(.*?)</p>', page).group(1)
    assert line.endswith("deleted 3 rows (1 dag_run, 2 task_instance).")


def test_dashboard_shows_the_newest_errors_and_warns_when_the_drain_failed_rows(staff_client):
    from assets_app.operations import heartbeats

    AssetEventQueueFactory(source_dag_id="ingest", source_task_id="old", last_error="Old: x")
    newest = AssetEventQueueFactory(
        source_dag_id="ingest",
        source_task_id="fetch",
        parked=True,
        last_error="RegistrationError: asset name='a' conflicts\nTraceback",
        last_error_kind="permanent",
    )
    heartbeats.record(component="drain", ok=True, detail={"failed": 2, "parked": 1})
    page = staff_client.get(reverse("asset_dashboard")).content.decode()
    errors = page[page.index('id="newest-errors"') :]
    assert errors.index(f"#{newest.pk}") < errors.index("ingest.old")
    assert "RegistrationError: asset name=&#x27;a&#x27; conflicts" in errors
    assert "Traceback" not in errors
    assert 'id="drain-warning" title="its last run failed 2 row(s), parked 1">warning<' in page


def test_a_freshness_policy_saved_in_the_admin_goes_through_its_checks_and_is_audited(
    staff_client,
):
    """Issue 29: the admin saves a policy through `freshness.set_policy` (its checks, the state
    starting over, the audit), and deletes it through `freshness.delete_policy`."""
    from assets_app.models import AuditEntry, FreshnessPolicy

    asset = AssetFactory(name="orders")
    add = reverse("admin:assets_app_freshnesspolicy_add")
    form = {"asset": asset.pk, "kind": "cron_deadline", "cron": "not a cron", "timezone": "UTC"}
    staff_client.post(add, form, follow=True)
    assert not FreshnessPolicy.objects.exists() and not AuditEntry.objects.exists()
    staff_client.post(add, {**form, "cron": "0 9 * * 1-5"}, follow=True)
    policy = FreshnessPolicy.objects.get()
    assert (policy.cron, policy.state) == ("0 9 * * 1-5", "unknown")
    entry = AuditEntry.objects.get(action="freshness_policy.set")
    assert entry.actor_name == "operator" and "orders" in entry.summary
    delete = reverse("admin:assets_app_freshnesspolicy_delete", args=[policy.pk])
    staff_client.post(delete, {"post": "yes"}, follow=True)
    assert not FreshnessPolicy.objects.exists()
    assert AuditEntry.objects.filter(action="freshness_policy.delete").count() == 1
