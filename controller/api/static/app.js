// ffswarm's web status page: plain JS, no build step, no third-party code (docs/api.md#web-page).
// The token lives in this tab's sessionStorage and goes only in the Authorization header: never in a
// URL. Live progress uses EventSource on a short-lived signed events URL (POST …/events-link), since
// EventSource cannot send a header; without signed links on the API the page polls instead.
// Everything from the API is put in the page as text (textContent), never as HTML.
"use strict";

(() => {
  const KEY = "ffswarm.token";
  const TERMINAL = new Set(["finished", "cancelled", "refused", "stopped"]);
  const MAX_STREAMS = 4; // live streams at once in the list (a browser opens ~6 connections per host)
  const POLL_MS = 3000;
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  let cleanups = []; // what the current view must close when it is left

  class Unauthorized extends Error {}

  const token = () => sessionStorage.getItem(KEY);

  async function api(path, opts = {}) {
    const headers = Object.assign({ Authorization: "Bearer " + token() }, opts.headers || {});
    const r = await fetch(path, Object.assign({}, opts, { headers, cache: "no-store", credentials: "omit" }));
    if (r.status === 401) {
      signOut("The token was not accepted: sign in again.");
      throw new Unauthorized();
    }
    return r;
  }

  async function apiJson(path, opts) {
    const r = await api(path, opts);
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) {
      const err = new Error((body && body.error && body.error.message) || "HTTP " + r.status);
      err.status = r.status;
      err.code = body && body.error && body.error.code;
      throw err;
    }
    return body;
  }

  function say(text) { $("message").textContent = text || ""; }

  function leave() {
    for (const f of cleanups) { try { f(); } catch (e) { /* already closed */ } }
    cleanups = [];
  }

  function show(id) {
    for (const s of ["sign-in", "jobs", "job"]) $(s).hidden = s !== id;
    $("sign-out").hidden = id === "sign-in";
  }

  function signOut(why) {
    sessionStorage.removeItem(KEY);
    leave();
    show("sign-in");
    $("sign-in-error").textContent = why || "";
  }

  function percent(row) {
    const i = row.items;
    if (!i || !i.total) return row.phase === "finished" ? 100 : 0;
    return Math.floor((100 * (i.total - i.pending)) / i.total);
  }

  function counts(row) {
    const i = row.items;
    if (!i) return "";
    return `${i.ok + i.no_face}/${i.total} done, ${i.failed} failed, ${i.pending} pending`;
  }

  // Follows one job: onRow(status object) on every change, until its end. Returns a stop function.
  function watch(job, onRow, live) {
    let es = null, timer = null, stopped = false;
    const poll = async () => {
      if (stopped) return;
      try {
        const row = await apiJson(`/v1/jobs/${enc(job)}`);
        onRow(row);
        if (TERMINAL.has(row.phase)) return;
      } catch (e) { if (e instanceof Unauthorized) return; }
      timer = setTimeout(poll, POLL_MS);
    };
    const open = async () => {
      if (stopped) return;
      let link;
      try {
        link = await apiJson(`/v1/jobs/${enc(job)}/events-link`, { method: "POST" });
      } catch (e) {
        if (!(e instanceof Unauthorized)) poll(); // signed links off (409): poll instead
        return;
      }
      if (stopped) return;
      es = new EventSource(link.url);
      es.addEventListener("progress", (ev) => onRow(JSON.parse(ev.data)));
      es.addEventListener("end", () => {
        es.close(); es = null;
        poll(); // the last status object, read once more with the token
      });
      es.onerror = () => {
        // A refused reconnect (expired link: 403) closes the source; ask for a new link.
        if (es && es.readyState === EventSource.CLOSED) { es = null; timer = setTimeout(open, 1000); }
      };
    };
    if (live) open(); else poll();
    return () => { stopped = true; if (es) es.close(); if (timer) clearTimeout(timer); };
  }

  // ---- the jobs list --------------------------------------------------------------------------
  async function jobsView() {
    show("jobs");
    const rows = $("job-rows");
    rows.replaceChildren();
    $("jobs-empty").hidden = true;
    let streams = 0;
    const load = async (cursor) => {
      const q = cursor ? `&cursor=${enc(cursor)}` : "";
      const page = await apiJson(`/v1/jobs?limit=50${q}`);
      $("jobs-empty").hidden = rows.children.length + page.jobs.length > 0;
      for (const first of page.jobs) {  // status objects, newest first
        const job = first.job;
        const tr = jobRow(job);
        rows.append(tr);
        tr.update(first);
        if (TERMINAL.has(first.phase)) continue;
        const live = streams < MAX_STREAMS;
        if (live) streams += 1;
        cleanups.push(watch(job, tr.update, live));
      }
      const more = $("jobs-more");
      more.hidden = !page.next_cursor;
      more.onclick = () => load(page.next_cursor).catch(failed);
    };
    await load(null);
  }

  function jobRow(job) {
    const tr = document.createElement("tr");
    tr.dataset.job = job;
    const link = document.createElement("a");
    link.href = `#/jobs/${enc(job)}`;
    link.textContent = job;
    const phase = document.createElement("td");
    phase.className = "phase";
    const bar = document.createElement("div");
    const box = document.createElement("div");
    box.className = "progress";
    box.append(bar);
    const pct = document.createElement("span");
    pct.className = "percent";
    const items = document.createElement("td");
    items.className = "counts";
    const cells = [document.createElement("td"), phase, document.createElement("td"), items];
    cells[0].append(link);
    cells[2].append(box, pct);
    tr.append(...cells);
    tr.update = (row) => {
      const p = percent(row);
      phase.textContent = row.phase;
      bar.style.width = p + "%";
      pct.textContent = p + " %";
      items.textContent = counts(row);
    };
    return tr;
  }

  // ---- one job ----------------------------------------------------------------------------------
  async function jobView(job) {
    show("job");
    $("job-title").textContent = job;
    $("items").replaceChildren();
    $("failures").replaceChildren();
    const cards = new Map();
    const urls = [];
    cleanups.push(() => urls.forEach((u) => URL.revokeObjectURL(u)));
    let lastDone = -1, refreshing = null, again = false;

    const render = (row) => {
      const p = percent(row);
      $("job-phase").textContent = row.phase;
      $("job-percent").textContent = p + " %";
      $("job-bar").style.width = p + "%";
      $("job-reason").textContent = row.reason || "";
      const dl = $("job-counts");
      dl.replaceChildren();
      const i = row.items || {};
      for (const [k, v] of [["total", i.total], ["ok", i.ok], ["no face", i.no_face], ["failed", i.failed],
        ["cancelled", i.cancelled], ["pending", i.pending]]) {
        if (v === undefined) continue;
        const dt = document.createElement("dt"); dt.textContent = k;
        const dd = document.createElement("dd"); dd.textContent = String(v); dd.dataset.count = k;
        dl.append(dt, dd);
      }
      const done = i.total === undefined ? 0 : i.total - i.pending;
      if (done !== lastDone || TERMINAL.has(row.phase)) { lastDone = done; refresh(); }
    };

    const thumb = async (item, which, img) => {
      const r = await api(`/v1/jobs/${enc(job)}/items/${enc(item)}/${which}?thumb=1`);
      if (!r.ok) { img.replaceWith(placeholder(which === "input" ? "no preview" : "no output")); return; }
      const url = URL.createObjectURL(await r.blob());
      urls.push(url);
      img.src = url;
    };

    const card = (it) => {
      let c = cards.get(it.id);
      if (!c) {
        c = document.createElement("div");
        c.className = "item";
        c.dataset.item = it.id;
        const title = document.createElement("div");
        title.className = "title";
        const status = document.createElement("div");
        status.className = "status";
        const pair = document.createElement("div");
        pair.className = "pair";
        c.append(title, status, pair);
        c.parts = { title, status, pair, before: null, after: null };
        cards.set(it.id, c);
        $("items").append(c);
        if (it.kind === "image" && it.input !== null) {
          const img = figure(pair, "before", "before");
          c.parts.before = img;
          thumb(it.id, "input", img).catch(() => {});
        } else {
          figureText(pair, "before", it.kind === "video" ? "video" : "no preview");
        }
        c.parts.afterBox = figureText(pair, "after", "not done yet");
      }
      c.parts.title.textContent = it.input || it.id;
      c.parts.status.textContent = (it.status || "pending") + (it.reason ? ": " + it.reason : "");
      c.parts.status.className = "status status-" + (it.status || "pending");
      if (it.has_output && !c.parts.after && it.kind === "image") {
        const fig = c.parts.afterBox;
        fig.remove();
        const img = figure(c.parts.pair, "after", "after");
        c.parts.after = img;
        thumb(it.id, "output", img).catch(() => {});
      } else if (!it.has_output && it.status) {
        c.parts.afterBox.querySelector(".placeholder").textContent = it.status === "error" ? "failed" : "no output";
      }
    };

    const refresh = () => {
      if (refreshing) { again = true; return; }
      refreshing = (async () => {
        const page = await apiJson(`/v1/jobs/${enc(job)}/items?limit=60`);
        page.items.forEach(card);
        const fails = await apiJson(`/v1/jobs/${enc(job)}/items?limit=100&status=error`);
        const ul = $("failures");
        ul.replaceChildren(...fails.items.map((it) => {
          const li = document.createElement("li");
          li.textContent = `${it.input || it.id}: ${it.reason || "failed"}`;
          return li;
        }));
        $("no-failures").hidden = fails.items.length > 0;
        const more = $("items-more");
        more.hidden = !page.next_cursor;
        more.onclick = () => moreItems(page.next_cursor);
      })().catch(failed).finally(() => {
        refreshing = null;
        if (again) { again = false; setTimeout(refresh, 500); }
      });
    };

    const moreItems = async (cursor) => {
      const page = await apiJson(`/v1/jobs/${enc(job)}/items?limit=60&cursor=${enc(cursor)}`).catch(failed);
      if (!page) return;
      page.items.forEach(card);
      $("items-more").hidden = !page.next_cursor;
      $("items-more").onclick = () => moreItems(page.next_cursor);
    };

    const first = await apiJson(`/v1/jobs/${enc(job)}`);
    render(first);
    if (!TERMINAL.has(first.phase)) cleanups.push(watch(job, render, true));
  }

  function figure(pair, cls, caption) {
    const fig = document.createElement("figure");
    const img = document.createElement("img");
    img.className = cls;
    img.alt = caption;
    const cap = document.createElement("figcaption");
    cap.textContent = caption;
    fig.append(img, cap);
    pair.append(fig);
    return img;
  }

  function figureText(pair, caption, text) {
    const fig = document.createElement("figure");
    fig.append(placeholder(text));
    const cap = document.createElement("figcaption");
    cap.textContent = caption;
    fig.append(cap);
    pair.append(fig);
    return fig;
  }

  function placeholder(text) {
    const d = document.createElement("div");
    d.className = "placeholder";
    d.textContent = text;
    return d;
  }

  function failed(e) {
    if (!(e instanceof Unauthorized)) say(e.message || String(e));
  }

  async function route() {
    leave();
    say("");
    if (!token()) { show("sign-in"); return; }
    const m = location.hash.match(/^#\/jobs\/([a-z0-9-]{1,40})$/);
    try {
      if (m) await jobView(m[1]); else await jobsView();
    } catch (e) { failed(e); }
  }

  async function signIn(ev) {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    $("token").value = "";
    try {
      await apiJson("/v1/jobs?limit=1");
    } catch (e) {
      if (!(e instanceof Unauthorized)) $("sign-in-error").textContent = e.message;
      return;
    }
    $("sign-in-error").textContent = "";
    if (location.hash.startsWith("#/jobs/")) route(); else if (location.hash === "#/") route(); else location.hash = "#/";
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => signOut(""));
    window.addEventListener("hashchange", route);
    route();
  });
})();
