"""The jobs page at scale: 10,000 running tracked jobs (a third of them DIRTY), the page
``/jobs/?evaluationStatus=DIRTY`` rendered in this process on real PostgreSQL (Django's test
client, signed in as a viewer), p50 and p95 over 50 renders, beside the API's answer to the
same query (``/api/v1/jobs?evaluationStatus=DIRTY``), alternated in the same run.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

from bench.member_loss import create_running_jobs, setup_django, sql
from tests.clusterkit import DatabaseTemplate

JOBS = 10_000
RENDERS = 50


def main() -> None:
    template = DatabaseTemplate()
    samples: dict[str, list[float]] = {"page": [], "api": []}
    try:
        db_name = template.clone()
        setup_django(db_name)
        logging.disable(logging.WARNING)
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.test import Client
        from rest_framework.authtoken.models import Token

        from engine.cluster.membership import register_member
        from engine.models import ClusterState, MasterLease
        from engine.roles import ensure_groups
        from engine.states import SlotMode

        MasterLease.objects.update_or_create(id=1, defaults={"epoch": 1, "holder": "bench"})
        ClusterState.objects.get_or_create(id=1)
        ensure_groups()
        member = register_member("bench-dashboard", 4, SlotMode.FIXED)
        t0 = time.perf_counter()
        create_running_jobs(JOBS, [member.id])
        sql("UPDATE engine_dirtyjobstate SET dirty = true WHERE job_id % 3 = 0")
        print(f"setup: {JOBS:,} jobs in {time.perf_counter() - t0:.1f} s")
        user = get_user_model().objects.create_user("bench-viewer")
        user.groups.add(Group.objects.get(name="viewer"))
        token = Token.objects.create(user=user).key
        page = Client(HTTP_HOST="127.0.0.1")
        page.force_login(user)
        api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {token}")
        urls = {
            "page": (page, "/jobs/?evaluationStatus=DIRTY"),
            "api": (api, "/api/v1/jobs?evaluationStatus=DIRTY"),
        }
        for name, (client, url) in urls.items():  # warm up
            response = client.get(url)
            if response.status_code != 200:
                raise AssertionError(f"{name}: {response.status_code} {response.content[:300]!r}")
        dirty = api.get(urls["api"][1]).json()["count"]
        for _ in range(RENDERS):
            for name, (client, url) in urls.items():
                started = time.perf_counter()
                response = client.get(url)
                samples[name].append(time.perf_counter() - started)
                assert response.status_code == 200
        member.close()
    finally:
        logging.disable(logging.NOTSET)
        if "django.db" in sys.modules:
            from django.db import connection

            connection.close()
        template.drop_all()

    def p(name: str, q: int) -> float:
        return statistics.quantiles(samples[name], n=100)[q - 1] * 1000

    print(f"{dirty:,} DIRTY jobs of {JOBS:,}, a page of 50")
    for name, label in (("page", "jobs page"), ("api", "API")):
        print(f"{label:>10}: p50 {p(name, 50):7.1f} ms, p95 {p(name, 95):7.1f} ms")
    print(f"ratio p95 page / API: {p('page', 95) / p('api', 95):.2f}")
