"""``asyncq dashboard`` as a real process: the Host names it answers to (a page whose name
is rebound to 127.0.0.1 gets nothing), ``--allowed-host``, its login from the environment,
and its refusal to start beyond loopback without one."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg

from tests.dashboard.conftest import (
    Job,
    Serve,
    csrf_token,
    dashboard_env,
    free_port,
    needs_the_extra,
    status_of,
)
from tests.harness.app import APP
from tests.harness.processes import Workers

needs_the_extra()

CARD = "4111 1111 1111 1111"
ARGS = f'{{"card": "{CARD}"}}'
USER, PASSWORD, TOKEN = "ops", "correct horse: battery", "t0ken-of-the-dashboard"
LOGIN = {
    "ASYNCQ_DASHBOARD_USER": USER,
    "ASYNCQ_DASHBOARD_PASSWORD": PASSWORD,
    "ASYNCQ_DASHBOARD_TOKEN": TOKEN,
}


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def a_form(url: str, job_id: int, **request: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The requeue form's field and the cookie it was signed for, as the job's page gives
    them: all a page that can read the dashboard needs to act."""
    page = httpx.get(f"{url}/jobs/{job_id}", **request)
    assert page.status_code == 200, page.text
    return {"csrf": csrf_token(page.text)}, {"cookie": f"asyncq_csrf={page.cookies['asyncq_csrf']}"}


def refused_by_host(reply: httpx.Response) -> None:
    assert reply.status_code == 400, reply.text
    assert reply.text.count("\n") == 1 and "--allowed-host NAME" in reply.text
    assert CARD not in reply.text and "csrf" not in reply.text
    assert "set-cookie" not in reply.headers
    assert "default-src 'none'" in reply.headers["content-security-policy"]


def test_a_page_rebound_to_127_0_0_1_reads_no_job_and_requeues_none(
    serve: Serve, job: Job, db: psycopg.Connection[Any]
) -> None:
    url = serve()
    failed = job(status="failed", args=ARGS)
    evil = f"evil.example:{port_of(url)}"
    # The attacker's page, once evil.example resolves to 127.0.0.1, is served by the
    # dashboard under the attacker's name: Host evil.example, and its own origin.
    for path in (f"/jobs/{failed}", "/jobs?status=failed", "/", "/metrics", "/style.css"):
        refused_by_host(httpx.get(url + path, headers={"host": evil}))
    form, cookie = a_form(url, failed)
    forged = httpx.post(
        f"{url}/jobs/{failed}/requeue",
        data=form,
        headers={"host": evil, "origin": f"http://{evil}", **cookie},
    )
    refused_by_host(forged)
    assert status_of(db, failed) == "failed"
    # The names of this machine's own loopback, on the dashboard's port, are answered.
    for name in ("127.0.0.1", "localhost", "[::1]"):
        page = httpx.get(f"{url}/jobs/{failed}", headers={"host": f"{name}:{port_of(url)}"})
        assert page.status_code == 200 and CARD in page.text, name
    done = httpx.post(f"{url}/jobs/{failed}/requeue", data=form, headers={"origin": url, **cookie})
    assert done.status_code == 303
    assert status_of(db, failed) == "queued"


def test_allowed_host_admits_a_name_on_any_port_or_on_one(
    serve: Serve, job: Job, db: psycopg.Connection[Any]
) -> None:
    url = serve("--allowed-host", "Jobs.Example", "--allowed-host", "other.example:9443")
    port = port_of(url)
    failed = job(status="failed", args=ARGS)
    for host in (f"jobs.example:{port}", "jobs.example", "JOBS.example:8443", "other.example:9443"):
        page = httpx.get(f"{url}/jobs/{failed}", headers={"host": host})
        assert page.status_code == 200 and CARD in page.text, host
    for host in (f"other.example:{port}", "other.example", f"evil.example:{port}"):
        refused_by_host(httpx.get(f"{url}/jobs/{failed}", headers={"host": host}))
    # Behind a proxy that sends its own Host (127.0.0.1:PORT) on: the action's Origin is
    # the allowed name the browser shows.
    form, cookie = a_form(url, failed)
    proxied = httpx.post(
        f"{url}/jobs/{failed}/requeue",
        data=form,
        headers={"origin": "https://jobs.example", **cookie},
    )
    assert proxied.status_code == 303
    assert status_of(db, failed) == "queued"


def test_a_login_from_the_environment_is_required_and_checked(
    serve: Serve, job: Job, db: psycopg.Connection[Any]
) -> None:
    url = serve("--host", "0.0.0.0", env=LOGIN)
    failed = job(status="failed", args=ARGS)
    wrong: list[Any] = [
        None,
        (USER, PASSWORD + "x"),
        (USER + "x", PASSWORD),
        ("", PASSWORD),
        (USER, ""),
        {"authorization": "Basic !!not-base64!!"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": f"Bearer {PASSWORD}"},
        {"authorization": TOKEN},
    ]
    for credentials in wrong:
        refusal = (
            httpx.get(f"{url}/jobs/{failed}", headers=credentials)
            if isinstance(credentials, dict)
            else httpx.get(f"{url}/jobs/{failed}", auth=credentials)
        )
        assert refusal.status_code == 401, credentials
        assert CARD not in refusal.text and "set-cookie" not in refusal.headers
        challenges = refusal.headers.get_list("www-authenticate")
        assert challenges == [
            'Basic realm="asyncq dashboard", charset="UTF-8"',
            'Bearer realm="asyncq dashboard"',
        ]
    for path in ("/", "/metrics", "/style.css"):
        assert httpx.get(url + path).status_code == 401, path
    page = httpx.get(f"{url}/jobs/{failed}", auth=(USER, PASSWORD))
    assert page.status_code == 200 and CARD in page.text
    scraped = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert scraped.status_code == 200 and "asyncq_queue_jobs" in scraped.text
    # A valid form without the login acts on nothing.
    form, cookie = a_form(url, failed, auth=(USER, PASSWORD))
    anonymous = httpx.post(f"{url}/jobs/{failed}/requeue", data=form, headers=cookie)
    assert anonymous.status_code == 401
    assert status_of(db, failed) == "failed"
    done = httpx.post(
        f"{url}/jobs/{failed}/requeue", data=form, headers=cookie, auth=(USER, PASSWORD)
    )
    assert done.status_code == 303
    assert status_of(db, failed) == "queued"


def test_beyond_loopback_without_a_login_it_refuses_to_start(workers: Workers) -> None:
    port = str(free_port())
    env = dashboard_env(workers)
    for host in ("0.0.0.0", "::", "dashboard.internal"):
        done = workers.cli("dashboard", APP, "--host", host, "--port", port, env=env, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert re.fullmatch(
            f"asyncq: error: the dashboard on {re.escape(host)} would have no login: set"
            " ASYNCQ_DASHBOARD_USER and ASYNCQ_DASHBOARD_PASSWORD \\(HTTP Basic\\) or"
            " ASYNCQ_DASHBOARD_TOKEN \\(bearer\\), or pass --insecure-no-auth\n",
            done.stderr,
        ), done.stderr
    # Nor with a name that is not a host's.
    done = workers.cli("dashboard", APP, "--allowed-host", "http://jobs.example", env=env)
    assert (done.returncode, done.stderr) == (
        2,
        "asyncq: error: --allowed-host 'http://jobs.example' is not a host: NAME or NAME:PORT"
        " ([::1]:8080)\n",
    )
    # Half a login is no login.
    half = {**env, "ASYNCQ_DASHBOARD_USER": "ops"}
    done = workers.cli("dashboard", APP, "--port", port, env=half, timeout=60)
    assert (done.returncode, done.stderr) == (
        2,
        "asyncq: error: set both ASYNCQ_DASHBOARD_USER and ASYNCQ_DASHBOARD_PASSWORD, or neither\n",
    )


def test_insecure_no_auth_serves_beyond_loopback_without_a_login(
    serve: Serve, job: Job, tmp_path: Any
) -> None:
    url = serve("--host", "0.0.0.0", "--insecure-no-auth")
    failed = job(status="failed", args=ARGS)
    page = httpx.get(f"{url}/jobs/{failed}")
    assert page.status_code == 200 and CARD in page.text
    log = (tmp_path / "dashboard-0.log").read_text()
    assert "has no login (--insecure-no-auth)" in log
    # The Host check holds all the same.
    refused_by_host(httpx.get(url, headers={"host": f"evil.example:{port_of(url)}"}))
