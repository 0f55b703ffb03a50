"""Live push: from the commit of a job's status change to the changed text in a real browser
(Debian's chromium, Playwright), p50 and p95 over 50 changes, pushed over the socket and,
side by side in the same run, with the socket disabled (the page's polling fallback). Goal:
p95 under 250 ms pushed. Then the database's transactions per second with 20 open tabs on an
idle cluster, beside none open (goal: no more per tab).

Each change cancels a job just submitted over the API (its status turns CANCELING or
CANCELED): the 202 comes after the commit, and the page records (MutationObserver, the same
machine's clock) when the row's status text changed.
"""

from __future__ import annotations

import shutil
import statistics
import time

import psycopg

from tests.clusterkit import Cluster, DatabaseTemplate

NO_SOCKETS = "window.WebSocket = function () { throw new Error('off'); };"
CHANGES = 50
TABS = 20
IDLE_SECONDS = 10.0
GOAL_P95_MS = 250.0
CONFIG = (
    "env { job.mode = STREAMING }\n"
    "source { FakeSource { rows.per-second = 1, endless = true } }\n"
    "sink { Blackhole { } }"
)
WATCH = """
(jobId) => { window.keelSeen = new Promise((resolve) => {
  const cell = () => document.querySelector(`tr[data-job-id="${jobId}"] [data-field="jobStatus"]`);
  const check = () => { const c = cell(); return c && c.textContent.startsWith("CANCEL"); };
  if (check()) { resolve(Date.now()); return; }
  const observer = new MutationObserver(() => {
    if (check()) { observer.disconnect(); resolve(Date.now()); }
  });
  observer.observe(document.body, { childList: true, subtree: true, characterData: true });
}); }
"""


def sign_in(page, base: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/?next=/jobs/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("table.jobs")


def latencies(cluster: Cluster, page, pushed: bool) -> list[float]:
    """Milliseconds from each cancel's commit to the browser showing it."""
    from tests.test_jobs_cluster import submit

    samples = []
    for _ in range(CHANGES):
        job_id = submit(cluster, CONFIG)
        page.wait_for_selector(f'tr[data-job-id="{job_id}"]', timeout=15_000)
        page.evaluate(WATCH, job_id)  # watches in the page (window.keelSeen)
        code, _ = cluster.post(f"/api/v1/jobs/{job_id}/cancel")
        committed = time.time() * 1000
        assert code == 202, code
        shown = page.evaluate("window.keelSeen")
        samples.append(max(shown - committed, 0.0))
    if pushed:
        assert page.evaluate("document.body.classList.contains('live')")
    return samples


def transactions(conn: psycopg.Connection, db: str, seconds: float) -> float:
    def count() -> int:
        return conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (db,)
        ).fetchone()[0]

    conn.execute("SELECT pg_stat_clear_snapshot()")
    before = count()
    time.sleep(seconds)  # a measurement window, not synchronisation
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return (count() - before) / seconds


def main() -> None:
    from playwright.sync_api import sync_playwright

    template = DatabaseTemplate()
    cluster = Cluster(template, masters=1, workers=1, slots=8)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        cluster.up()
        base = f"http://127.0.0.1:{cluster.port}"
        password = (cluster.var_dir / "admin-password").read_text().strip()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            pushed_page = browser.new_page()
            sign_in(pushed_page, base, password)
            pushed_page.wait_for_function("document.body.classList.contains('live')")
            polled_page = browser.new_page()
            polled_page.add_init_script(
                "window.WebSocket = function () { throw new Error('off'); };"
            )
            sign_in(polled_page, base, password)
            pushed = latencies(cluster, pushed_page, pushed=True)
            polled = latencies(cluster, polled_page, pushed=False)
            pushed_page.close()
            polled_page.close()

            with psycopg.connect(cluster.database_url, autocommit=True) as conn:
                idle = transactions(conn, cluster.db_name, IDLE_SECONDS)
                tabs = [browser.new_page() for _ in range(TABS)]
                for tab in tabs:
                    sign_in(tab, base, password)
                    tab.wait_for_function("document.body.classList.contains('live')")
                open_tabs = transactions(conn, cluster.db_name, IDLE_SECONDS)
            browser.close()
    finally:
        cluster.down()
        template.drop_all()

    def p(samples: list[float], q: float) -> float:
        return statistics.quantiles(samples, n=100)[q - 1]

    for label, samples in (("pushed (socket)", pushed), ("polled (fallback)", polled)):
        print(
            f"{label:>18}: p50 {p(samples, 50):7.1f} ms, p95 {p(samples, 95):7.1f} ms "
            f"over {len(samples)} changes"
        )
    print(
        f"ratio p95 pushed / polled: {p(pushed, 95) / p(polled, 95):.3f} "
        f"(goal pushed p95 < {GOAL_P95_MS:.0f} ms: "
        f"{'met' if p(pushed, 95) < GOAL_P95_MS else 'MISSED'})"
    )
    extra = (open_tabs - idle) / TABS
    print(
        f"idle cluster: {idle:.1f} transactions/s with no tab, {open_tabs:.1f} with {TABS} tabs "
        f"({extra:+.2f} per tab; goal: none per tab)"
    )
