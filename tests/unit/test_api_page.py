"""The web status page at / and the routes it uses, over real HTTP on loopback: a job's items with
their reasons, before/after thumbnails (only that job's files in its tenant's area, never through a
link), signed events links for EventSource, and the page itself in headless Chromium (Debian's
/usr/bin/chromium driven by Playwright: it signs in, watches a running job reach 100 % while this
test commits its items, and shows before/after images that decode); an EventSource whose stream a
proxy cuts mid-job reconnects by itself with Last-Event-ID and resumes without a replay."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.results import ItemResult, ItemStatus
from controller.api import events as event_stream
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.rundir import Control, RunDir
from tests.builders import KEYS, Env, api_env

JOB = "party-abcdefgh"
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# Without the networking flags Chromium's own outgoing connections are refused and logged.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="no /usr/bin/chromium (scripts/dev-swarm.sh installs it)"
)
FAILED_REASON = "no face found in tenants/acme/in/2.jpg"  # as a runner words it: from the data root
SHOWN_REASON = "no face found in in/2.jpg"  # as the tenant reads it: from its area


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def photo(width: int, height: int, shade: int) -> bytes:
    """A real JPEG: a colour gradient with a disc, so that a decoded thumbnail is not blank."""
    x = np.linspace(0, 255, width, dtype=np.uint8)
    img = np.zeros((height, width, 3), np.uint8)
    img[:, :, 0] = x
    img[:, :, 1] = shade
    img[:, :, 2] = x[::-1]
    cv2.circle(img, (width // 2, height // 2), min(width, height) // 4, (255, 255, 255), -1)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return bytes(buf.tobytes())


class Run:
    """A run folder fabricated as a running job leaves it: four photos planned, nothing done yet;
    ``commit(n)`` writes item n's output and result line as a runner would (item 2 fails)."""

    def __init__(self, env: Env, job: str = JOB, tenant: str = "acme") -> None:
        self.env = env
        area = Area(env.root, tenant)
        area.ensure(None)
        area.write_record(job, uploads=False)
        base = f"tenants/{tenant}"
        self.items = tuple(
            PlannedItem(f"i{n:06d}", f"{base}/in/{n}.jpg", f"{base}/out/{job}/{n}.jpg", "image") for n in range(4)
        )
        for n, item in enumerate(self.items):
            (env.root / item.input).parent.mkdir(parents=True, exist_ok=True)
            (env.root / item.input).write_bytes(photo(640, 480, 60 * n))
        plan = Plan(job, self.items, (Chunk("c0000", tuple(i.id for i in self.items)),))
        self.rd = RunDir(env.root, job)
        self.rd.create(b"name: x\n", plan, {}, Control(2), "sha256:x")
        (env.root / base / "out" / job).mkdir(parents=True)
        self.results = self.rd.path / "results" / "c0000.jsonl"

    def commit(self, n: int) -> None:
        item, now = self.items[n], time.time()
        if n == 2:
            line = ItemResult(item.id, ItemStatus.ERROR, 1, f"/data/{item.input}", None, reason=FAILED_REASON)
        else:
            (self.env.root / item.output).write_bytes(photo(800, 600, 255 - 60 * n))
            line = ItemResult(item.id, ItemStatus.OK, 1, f"/data/{item.input}", f"/data/{item.output}")
        line = ItemResult(**{**line.__dict__, "started": now, "finished": now})
        with self.results.open("a") as f:
            f.write(line.to_line())


def decoded(data: bytes) -> tuple[int, int]:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None
    return img.shape[1], img.shape[0]


def test_items_list_statuses_and_reasons_with_paths_as_the_tenant_knows_them(env: Env) -> None:
    run = Run(env)
    for n in range(4):
        run.commit(n)
    with env.client() as c:
        rows = c.get(f"/v1/jobs/{JOB}/items").json()["items"]
        assert [(r["input"], r["status"], r["has_output"]) for r in rows] == [
            ("in/0.jpg", "ok", True),
            ("in/1.jpg", "ok", True),
            ("in/2.jpg", "error", False),
            ("in/3.jpg", "ok", True),
        ]
        failed = c.get(f"/v1/jobs/{JOB}/items", params={"status": "error"}).json()["items"]
        assert [(r["id"], r["reason"]) for r in failed] == [("i000002", SHOWN_REASON)]
        page = c.get(f"/v1/jobs/{JOB}/items", params={"limit": 3}).json()
        assert len(page["items"]) == 3 and page["next_cursor"] == "i000002"
    with env.client("globex") as c:
        assert c.get(f"/v1/jobs/{JOB}/items").status_code == 404


def test_thumbnails_are_small_jpegs_of_that_jobs_files_only(env: Env) -> None:
    run = Run(env)
    run.commit(0)
    run.commit(2)
    base = f"/v1/jobs/{JOB}/items"
    with env.client() as c:
        r = c.get(f"{base}/i000000/input", params={"thumb": 1})
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
        assert decoded(r.content) == (256, 192)
        assert decoded(c.get(f"{base}/i000000/output", params={"thumb": 64}).content) == (64, 48)
        whole = c.get(f"{base}/i000000/output")
        assert whole.content == (env.root / run.items[0].output).read_bytes()
        assert (
            whole.headers["x-content-type-options"] == "nosniff"
            and "sandbox" in whole.headers["content-security-policy"]
        )
        assert c.get(f"{base}/i000002/output").json()["error"]["code"] == "no_output"  # failed: nothing
        assert c.get(f"{base}/i000001/output").status_code == 404  # not committed yet
        assert c.get(f"{base}/i000009/input").status_code == 404
        assert c.get(f"{base}/i000000/input", params={"thumb": 5000}).status_code == 400
    with env.client("globex") as c:
        assert c.get(f"{base}/i000000/input", params={"thumb": 1}).status_code == 404


def test_an_input_swapped_for_a_symlink_or_a_fifo_is_not_opened(env: Env) -> None:
    run = Run(env)
    secret = env.root / "tenants" / "globex" / "private.jpg"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(photo(64, 64, 0))
    src = env.root / run.items[1].input
    src.unlink()
    src.symlink_to(secret)
    with env.client() as c:
        for q in ({}, {"thumb": 1}):
            r = c.get(f"/v1/jobs/{JOB}/items/i000001/input", params=q)
            assert r.status_code == 404 and r.json()["error"]["file"] == "in/1.jpg"
            assert str(env.root) not in r.text
    fifo = env.root / run.items[2].input  # a FIFO where a photo was: answered at once, never read
    fifo.unlink()
    os.mkfifo(fifo)
    with env.client() as c:
        assert c.get(f"/v1/jobs/{JOB}/items/i000002/input", params={"thumb": 1}, timeout=5).status_code == 404


def test_a_photo_claiming_a_huge_canvas_gets_no_thumbnail_and_other_bytes_are_downloads(env: Env) -> None:
    run = Run(env)
    # A PNG header saying 60000×60000 pixels: refused from the header, before anything is decoded.
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + (60000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00" + b"\0" * 64
    (env.root / run.items[0].input).write_bytes(png)
    (env.root / run.items[3].input).write_bytes(b"<html><script>alert(1)</script></html>")
    with env.client() as c:
        r = c.get(f"/v1/jobs/{JOB}/items/i000000/input", params={"thumb": 1})
        assert r.status_code == 422 and r.json()["error"]["code"] == "no_thumbnail" and "60000x60000" in r.text
        html = c.get(f"/v1/jobs/{JOB}/items/i000003/input")
        assert html.headers["content-type"] == "application/octet-stream"
        assert html.headers["content-disposition"].startswith("attachment")
        assert c.get(f"/v1/jobs/{JOB}/items/i000003/input", params={"thumb": 1}).status_code == 422


def test_a_signed_events_link_streams_without_a_token_for_that_job_only(env: Env) -> None:
    run = Run(env)
    for n in range(4):
        run.commit(n)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{JOB}/events-link")
        assert r.status_code == 200
        url, expires = r.json()["url"], r.json()["expires"]
        assert KEYS["acme"] not in url and 0 < expires - time.time() <= 300
    with env.client("globex") as c:
        assert c.post(f"/v1/jobs/{JOB}/events-link").status_code == 404
    with env.client(tenant=None) as anon:
        assert anon.get(f"/v1/jobs/{JOB}/events").status_code == 401
        with anon.stream("GET", url) as s:
            assert s.status_code == 200
            text = "".join(s.iter_text())
        assert "event: end" in text and '"phase": "finished"' in text
        query = url.split("?", 1)[1]
        assert anon.get(f"/v1/jobs/{JOB}/results.zip?{query}").status_code == 403  # signed for the events only
        assert anon.get(url.replace("sig=", "sig=0")).status_code == 403


def test_the_page_is_self_contained(env: Env) -> None:
    with env.client(tenant=None) as anon:
        page = anon.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        for name in ("app.js", "app.css"):
            body = anon.get(f"/static/{name}").text
            assert "http://" not in body and "https://" not in body  # no CDN, nothing from elsewhere
        assert anon.get("/static/../app.py").status_code == 404


@needs_chromium
def test_the_page_signs_in_watches_a_job_reach_100_and_shows_before_and_after(env: Env) -> None:
    from playwright.sync_api import expect, sync_playwright

    run = Run(env)
    requested: list[str] = []
    shot = ROOT / "build" / "test-api-page.png"
    shot.parent.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda r: requested.append(r.url))
            page.goto(env.url + "/")
            page.fill("#token", "wrong-key")
            page.click("#sign-in-form button")
            expect(page.locator("#sign-in-error")).to_contain_text("sign in again")
            page.fill("#token", KEYS["acme"])
            page.click("#sign-in-form button")
            row = page.locator(f"tr[data-job='{JOB}']")
            expect(row.locator(".percent")).to_have_text("0 %")
            for n, want in enumerate(("25 %", "50 %", "75 %", "100 %")):
                run.commit(n)  # the page is watching: each committed item shows without a reload
                expect(row.locator(".percent")).to_have_text(want, timeout=10_000)
            expect(row.locator(".phase")).to_have_text("finished")
            assert any("/events?expires=" in u for u in requested), "live progress came from the events stream"

            row.locator("a").click()
            expect(page.locator("#job-percent")).to_have_text("100 %")
            expect(page.locator("#failures")).to_contain_text(f"in/2.jpg: {SHOWN_REASON}")
            expect(page.locator("dd[data-count='failed']")).to_have_text("1")
            expect(page.locator("img.before")).to_have_count(4)
            expect(page.locator("img.after")).to_have_count(3)
            page.wait_for_function(
                "() => [...document.querySelectorAll('img.before, img.after')]"
                ".every(i => i.complete && i.naturalWidth > 0)",
                timeout=10_000,
            )
            widths = page.eval_on_selector_all("img.before, img.after", "els => els.map(e => e.naturalWidth)")
            assert len(widths) == 7 and all(0 < w <= 256 for w in widths)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 0
    assert not any(KEYS["acme"] in u for u in requested), "the token never travels in a URL"


class CuttingProxy:
    """A TCP relay on loopback in front of the API, as a load balancer is: ``cut()`` drops every
    connection it carries now; ``sent`` is everything clients sent through it, per connection."""

    def __init__(self, upstream: str) -> None:
        self.upstream = int(upstream.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        self.sent: list[bytearray] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            record = bytearray()
            with self.lock:
                self.open += [client, upstream]
                self.sent.append(record)
            threading.Thread(target=self._pump, args=(client, upstream, record), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            dropped, self.open = self.open, []
        for s in dropped:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        self.cut()

    def requests(self, path: str) -> list[dict[str, str]]:
        """The headers of each request for ``path`` (any query) that went through, in order."""
        with self.lock:
            raw = b"".join(bytes(r) for r in self.sent)
        heads = re.findall(rb"GET " + re.escape(path.encode()) + rb"[? ][^\r\n]*\r\n(.*?)\r\n\r\n", raw, re.S)
        return [
            {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.decode().split("\r\n"))}
            for head in heads
        ]


@needs_chromium
def test_an_eventsource_cut_by_a_proxy_reconnects_by_itself_and_resumes_without_a_replay(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import sync_playwright

    monkeypatch.setattr(event_stream, "RETRY_MS", 200)  # the browser reconnects after 3 s in service
    run = Run(env)
    proxy = CuttingProxy(env.url)
    with env.client() as c:
        link = c.post(f"/v1/jobs/{JOB}/events-link").json()["url"]
    collect = """url => {
        window.got = [];
        const es = new EventSource(url);
        for (const type of ["chunk", "progress", "end"]) es.addEventListener(type, ev => {
            window.got.push({type, id: ev.lastEventId, data: JSON.parse(ev.data)});
            if (type === "end") es.close();
        });
    }"""
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(proxy.url + "/")
                page.evaluate(collect, proxy.url + link)
                page.wait_for_function("() => window.got.some(e => e.type === 'progress')", timeout=10_000)
                before = page.evaluate("() => window.got")
                proxy.cut()  # the load balancer drops the stream mid-job
                run.commit(0)
                page.wait_for_function(f"() => window.got.length > {len(before)}", timeout=10_000)
                for n in (1, 2, 3):
                    run.commit(n)
                page.wait_for_function("() => window.got.some(e => e.type === 'end')", timeout=10_000)
                got = page.evaluate("() => window.got")
            finally:
                browser.close()
    finally:
        proxy.close()
    opened = proxy.requests(f"/v1/jobs/{JOB}/events")
    assert len(opened) == 2 and "last-event-id" not in opened[0]
    assert opened[1]["last-event-id"] == before[-1]["id"]  # sent by the browser itself
    seqs = [int(e["id"].split(".")[0]) for e in got]
    assert seqs == sorted(set(seqs))  # each event once, in order, across the two connections
    after = got[len(before) :]
    assert [e["type"] for e in after if e["type"] != "progress"] == ["end"]
    assert all(e["data"] != before[-1]["data"] for e in after)  # the status before the cut is not sent again
    assert after[-2]["data"]["items"]["ok"] == 3 and after[-1]["data"]["outcome"] == "partial"
