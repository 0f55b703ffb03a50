"""The operator's view in a real browser (Debian's chromium driven by Playwright)."""

from __future__ import annotations

import shutil
import signal

import pytest

from tests.clusterkit import wait_for
from tests.test_jobs_cluster import submit

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


def test_operator_logs_in_and_watches_a_worker_die(healthy, browser):
    password = (healthy.var_dir / "admin-password").read_text().strip()
    page = browser.new_page()
    base = f"http://127.0.0.1:{healthy.port}"
    page.goto(f"{base}/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("table.members")
    _, holder = healthy.active_master()
    assert holder in page.inner_text(".cards")
    rows = page.locator("table.members tbody tr.state-alive")
    # Both workers, as soon as the page (live) has them: a worker restored for this test may
    # register a moment after the page was first rendered.
    wait_for(lambda: rows.count() == 2, 15, interval=0.1, what="two alive members on the page")

    worker_uuid = healthy.one(
        "SELECT uuid::text FROM engine_member WHERE name = 'worker-1' AND state = 'ALIVE'"
    )
    healthy.signal("worker-1", signal.SIGKILL)
    # The page refreshes itself (htmx); the killed member turns REMOVED without a reload.
    row = page.locator("tr", has_text=worker_uuid)
    wait_for(
        lambda: "REMOVED" in row.inner_text(),
        15,
        interval=0.2,
        what="the dashboard to show the worker REMOVED",
    )
    # A job submitted over the API shows up, live, and finishes with its row count.
    submit(
        healthy,
        "env { job.name = browser-job }\nsource { FakeSource { row.num = 321 } }\n"
        "sink { Blackhole {} }",
    )
    job_row = page.locator("table.jobs tr", has_text="browser-job")
    wait_for(
        lambda: job_row.count() == 1 and "FINISHED" in job_row.inner_text(),
        30,
        interval=0.2,
        what="the dashboard to show the job FINISHED",
    )
    assert "321" in job_row.inner_text()
    # The recovery (dirty-job) badge: DISABLED without the option, CLEAN with it.
    assert "DISABLED" in job_row.inner_text()
    submit(
        healthy,
        "env { job.name = tracked-job, job.dirty-task.threshold = 2 }\n"
        "source { FakeSource { row.num = 10 } }\nsink { Blackhole {} }",
    )
    tracked = page.locator("table.jobs tr", has_text="tracked-job")
    wait_for(
        lambda: tracked.count() == 1 and "FINISHED" in tracked.inner_text(),
        30,
        interval=0.2,
        what="the tracked job to finish",
    )
    assert "CLEAN" in tracked.locator(".badge.dirty-clean").inner_text()
    # The job's page: its label and (no) recovery episodes, live.
    tracked.locator("a", has_text="tracked-job").click()
    page.wait_for_selector("h2:has-text('Recovery episodes')", timeout=10_000)
    assert "CLEAN" in page.locator("dl.summary").inner_text()
    assert "No recovery episode" in page.locator("table.episodes").inner_text()
    page.screenshot(path=str(healthy.var_dir / "dashboard.png"))
    page.close()


def test_a_health_badge_flips_to_dirty_live_without_a_reload(healthy, browser):
    """Pushed over the socket: a worker dies under a tracked job and the jobs page's badge for
    it turns DIRTY in place (the page is never reloaded); the DIRTY filter and the episode
    timeline then show it."""
    password = (healthy.var_dir / "admin-password").read_text().strip()
    base = f"http://127.0.0.1:{healthy.port}"
    job_id = submit(
        healthy,
        "env { job.name = live-dirty, job.mode = STREAMING, job.dirty-task.threshold = 1,"
        " job.retry.interval.seconds = 0 }\n"
        "source { FakeSource { rows.per-second = 50, endless = true } }\nsink { Blackhole {} }",
    )
    page = browser.new_page()
    page.goto(f"{base}/jobs/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector(f'tr[data-job-id="{job_id}"]')
    page.wait_for_function("document.body.classList.contains('live')", timeout=10_000)
    page.evaluate("window.keelNotReloaded = true")
    health = page.locator(f'tr[data-job-id="{job_id}"] [data-field="evaluationStatus"]')
    status = page.locator(f'tr[data-job-id="{job_id}"] [data-field="jobStatus"]')
    wait_for(lambda: status.inner_text() == "RUNNING", 30, interval=0.1, what="RUNNING")
    assert health.inner_text() == "CLEAN"

    host = healthy.one(
        "SELECT m.name FROM engine_taskgroup t JOIN engine_member m ON m.id = t.member_id"
        " WHERE t.job_id = %s AND t.kind = 'READER'",
        (job_id,),
    )
    healthy.signal(host, signal.SIGKILL)
    wait_for(lambda: health.inner_text() == "DIRTY", 30, interval=0.1, what="the badge to flip")
    assert page.evaluate("window.keelNotReloaded === true")  # pushed, not reloaded
    page.screenshot(path=str(healthy.var_dir / "badge-dirty.png"))

    page.goto(f"{base}/jobs/?evaluationStatus=DIRTY")
    assert page.locator("tr[data-job-id]").count() == 1
    page.click(f'tr[data-job-id="{job_id}"] a')
    page.wait_for_selector("table.episodes")
    wait_for(
        lambda: "No recovery episode" not in page.inner_text("table.episodes"),
        20,
        interval=0.2,
        what="the episode timeline",
    )
    page.screenshot(path=str(healthy.var_dir / "episodes.png"))
    page.close()


SET_PASSWORD = """
from django.contrib.auth import get_user_model
user = get_user_model().objects.get(username="{role}")
user.set_password("{password}")
user.save()
"""


def sign_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("header.top nav")


def test_submit_shows_the_error_at_its_line_and_only_operators_can_cancel(healthy, browser):
    healthy.restore()
    base = f"http://127.0.0.1:{healthy.port}"
    for role in ("viewer", "operator"):  # ./run cluster up made them, token only
        healthy.run(
            "manage", "shell", "-c", SET_PASSWORD.format(role=role, password=f"{role}-pass-123")
        )
    operator = browser.new_page()
    sign_in(operator, base, "operator", "operator-pass-123")
    operator.goto(f"{base}/submit/")
    operator.fill(
        "textarea[name=config]",
        "env {\n  job.mode = STREAMING\n  parallelism = 0\n}\n"
        "source { FakeSource { rows.per-second = 5, endless = true } }\nsink { Blackhole { } }",
    )
    operator.click("form.submit button[type=submit]")
    error = operator.locator('.inline-error[data-error-line="3"]')
    error.wait_for()
    assert "env.parallelism" in error.inner_text()
    assert operator.locator('.gutter li.bad[data-line="3"]').count() == 1
    operator.screenshot(path=str(healthy.var_dir / "submit-error.png"))
    operator.fill(
        "textarea[name=config]",
        'env { job.name = "cancel-me", job.mode = STREAMING }\n'
        "source { FakeSource { rows.per-second = 5, endless = true } }\nsink { Blackhole { } }",
    )
    operator.click("form.submit button[type=submit]")
    operator.wait_for_selector("h1:has-text('cancel-me')")
    job_url = operator.url

    viewer = browser.new_page()
    sign_in(viewer, base, "viewer", "viewer-pass-123")
    viewer.goto(job_url)
    viewer.wait_for_selector("h1:has-text('cancel-me')")
    assert viewer.locator('[data-action="cancel"]').count() == 0
    viewer.screenshot(path=str(healthy.var_dir / "viewer-no-cancel.png"))

    operator.on("dialog", lambda dialog: dialog.accept())
    operator.click('[data-action="cancel"]')
    operator.wait_for_selector("h1:has-text('cancel-me')")
    status = operator.locator("dl.summary")
    wait_for(lambda: "CANCEL" in status.inner_text(), 20, interval=0.2, what="the cancel")
    operator.screenshot(path=str(healthy.var_dir / "operator-cancel.png"))
    operator.close()
    viewer.close()


# -- what an operator sees on the pages (one signed-in session for all of them) ----------------


def base_url(cluster) -> str:
    return f"http://127.0.0.1:{cluster.port}"


@pytest.fixture(scope="module")
def admin_context(cluster, browser):
    """One signed-in admin session for the page checks below (the admin may cancel)."""
    context = browser.new_context()
    page = context.new_page()
    password = (cluster.var_dir / "admin-password").read_text().strip()
    sign_in(page, base_url(cluster), "admin", password)
    page.close()
    yield context
    context.close()


def wait_live(page) -> None:
    page.wait_for_function("document.body.classList.contains('live')", timeout=15_000)


def live_seq(page) -> int:
    return int(page.get_attribute("#live-seq", "data-seq"))


def wait_live_render(page, cluster) -> None:
    """The page's socket sends it a fresh render (a job submitted elsewhere is an event of the
    jobs page): from here on the page shows what the socket rendered, not the first load."""
    wait_live(page)
    seq = live_seq(page)
    submit(
        cluster,
        "env { job.name = nudge }\nsource { FakeSource { row.num = 1 } }\nsink { Blackhole {} }",
    )
    wait_for(lambda: live_seq(page) > seq, 20, interval=0.1, what="a live render of the page")


def shown_job_ids(page) -> list[int]:
    return page.eval_on_selector_all(
        "#job-rows tr[data-job-id]", "rows => rows.map(r => Number(r.dataset.jobId))"
    )


def test_the_jobs_page_shows_no_template_comment(healthy, admin_context):
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/jobs/")
    page.wait_for_selector("form.filter")
    text = page.inner_text("main")
    assert "{#" not in text and "ws extension" not in text, text[:300]
    page.close()


@pytest.fixture(scope="module")
def cleaned_batch_job(cluster) -> int:
    """A finished batch job of 4,000 rows whose running state (task groups included) the
    master's cleanup sweep has removed: it is made due now instead of after the delay."""
    job_id = submit(
        cluster,
        "env { job.name = rows-4000 }\nsource { FakeSource { row.num = 4000 } }\n"
        "sink { Blackhole {} }",
    )
    wait_for(
        lambda: cluster.one("SELECT status FROM engine_job WHERE id = %s", (job_id,)) == "FINISHED",
        60,
        interval=0.1,
        what="the batch job to finish",
    )
    record = "FROM engine_jobcleanuprecord WHERE job_id = %s AND kind = 'JOB_STATE'"
    cluster.db.execute(
        f"UPDATE engine_jobcleanuprecord SET due_at = now() WHERE id = (SELECT id {record})",
        (job_id,),
    )
    wait_for(
        lambda: cluster.one(f"SELECT state {record}", (job_id,)) == "DONE",
        30,
        interval=0.1,
        what="the job's running state to be cleaned up",
    )
    assert cluster.one("SELECT count(*) FROM engine_taskgroup WHERE job_id = %s", (job_id,)) == 0
    return job_id


def test_recent_jobs_show_the_rows_of_a_cleaned_up_batch_job(
    healthy, admin_context, cleaned_batch_job
):
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/")
    row = page.locator("table.jobs tbody tr", has_text="rows-4000")
    row.wait_for()
    cells = row.locator("td")
    assert (cells.nth(5).inner_text(), cells.nth(6).inner_text()) == ("4000", "4000")
    row.locator("a").first.click()  # the detail says the same
    page.wait_for_selector(f"h1:has-text('Job {cleaned_batch_job}')")
    assert "4000 rows read, 4000 written" in page.inner_text("p.throughput")
    page.close()


def test_a_job_page_is_at_its_trailing_slash_and_the_old_path_redirects(
    healthy, admin_context, cleaned_batch_job
):
    base, job_id = base_url(healthy), cleaned_batch_job
    page = admin_context.new_page()
    response = page.goto(f"{base}/jobs/{job_id}/")
    assert response.status == 200
    page.wait_for_selector(f"h1:has-text('Job {job_id}')")
    page.goto(f"{base}/jobs/{job_id}")
    assert page.url == f"{base}/jobs/{job_id}/"
    page.wait_for_selector(f"h1:has-text('Job {job_id}')")
    # The pages link to it so.
    page.goto(f"{base}/jobs/?q={job_id}")
    link = page.locator(f'tr[data-job-id="{job_id}"] a')
    assert link.get_attribute("href") == f"/jobs/{job_id}/"
    page.close()


def test_the_cancel_button_goes_when_the_job_ends(healthy, admin_context):
    """The job is cancelled elsewhere (the API) while its page is open: the page's live update
    takes its Cancel button away with the status, without a reload."""
    job_id = submit(
        healthy,
        'env { job.name = "ends-elsewhere", job.mode = STREAMING }\n'
        "source { FakeSource { rows.per-second = 5, endless = true } }\nsink { Blackhole { } }",
    )
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/jobs/?q={job_id}")
    page.click(f'tr[data-job-id="{job_id}"] a')
    page.wait_for_selector("h1:has-text('ends-elsewhere')")
    wait_live(page)
    page.evaluate("window.keelNotReloaded = true")
    assert page.locator('[data-action="cancel"]').count() == 1
    code, body = healthy.post(f"/api/v1/jobs/{job_id}/cancel")
    assert code == 202, body
    status = page.locator("dl.summary .badge").first
    wait_for(lambda: status.inner_text() == "CANCELED", 30, interval=0.1, what="CANCELED live")
    assert page.locator('[data-action="cancel"]').count() == 0
    assert page.evaluate("window.keelNotReloaded === true")
    page.close()


@pytest.fixture(scope="module")
def many_jobs(cluster):
    """Jobs enough for two pages of one search (51 ``paged-N``), and a name with an ampersand
    beside one its unencoded prefix would also match."""

    def job(name: str) -> dict:
        return {
            "params": {"jobName": name},
            "env": {"job.mode": "BATCH"},
            "source": [{"plugin_name": "FakeSource", "row.num": 1}],
            "sink": [{"plugin_name": "Blackhole"}],
        }

    names = [f"paged-{n}" for n in range(51)] + ["amp&and", "amp-decoy"]
    code, body = cluster.post("/submit-jobs", [job(name) for name in names])
    assert code == 200, body
    ids = {j["jobName"]: int(j["jobId"]) for j in body}
    yield {
        "paged": sorted((ids[n] for n in names[:51]), reverse=True),
        "amp": [ids["amp&and"]],
    }
    # They end before the cluster goes down (workers leaving under 50 jobs are slow to stop).
    wait_for(
        lambda: (
            cluster.one(
                "SELECT count(*) FROM engine_job WHERE id = ANY(%s) AND status <> 'FINISHED'",
                (list(ids.values()),),
            )
            == 0
        ),
        120,
        interval=0.2,
        what="the many jobs to finish",
    )


def test_live_updates_of_the_jobs_page_keep_its_page(healthy, admin_context, many_jobs):
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/jobs/?q=paged-&page=2")
    assert shown_job_ids(page) == many_jobs["paged"][50:]
    wait_live_render(page, healthy)
    assert shown_job_ids(page) == many_jobs["paged"][50:]
    assert "page 2 of 2" in page.inner_text("nav.pages")
    page.close()


def test_live_updates_of_the_jobs_page_keep_a_search_with_an_ampersand(
    healthy, admin_context, many_jobs
):
    page = admin_context.new_page()
    page.goto(f"{base_url(healthy)}/jobs/?q=amp%26and")
    assert shown_job_ids(page) == many_jobs["amp"]
    wait_live_render(page, healthy)
    assert shown_job_ids(page) == many_jobs["amp"]
    page.close()
