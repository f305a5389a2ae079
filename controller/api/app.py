"""The Starlette application: routes, the one error translation point, and its start-up.

Stateless: every answer is read from the data root (run folders, the inbox, tenant areas), so any
number of replicas may serve the same volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from controller import log
from controller.api import accept, idempotency, objects, ops, page, quota, results, submit, uploads, views
from controller.api import deliveries as api_deliveries
from controller.api import events as event_stream
from controller.api import usage as api_usage
from controller.api import workers as api_workers
from controller.api.accept import Accepted
from controller.api.area import Area, run_owner
from controller.api.auth import Authenticator, JwtVerifier, check_link_generation, read_key_file, verify_link
from controller.api.errors import not_found
from controller.api.fairness import Fairness
from controller.api.intake import Intake, Staged
from controller.api.listing import Query, list_page
from controller.api.metrics import ApiMetrics
from controller.api.openapi import document
from controller.api.routing import (
    capped_body,
    check_documented,
    framework_error,
    guard,
    json_body,
    media_type,
    table_routes,
)
from controller.api.slow import Lent, SlowWork
from controller.api.sweep import Staging, every, sweep_uploads
from controller.api.uploads import Budget
from controller.api.waiting import preference, until_ended
from controller.apiconfig import Tenant
from controller.config import Config, warn_cluster_keys
from controller.errors import FfswarmError
from controller.job import access
from controller.run import links

Handler = Callable[[Request], Awaitable[Response]]
MAX_JSON = 1024**2
THREADS = min(32, (os.cpu_count() or 1) + 4)  # asyncio's own default, named: see _threads


class Api:
    def __init__(self, config: Config) -> None:
        self.config = config
        jwt_settings = config.api.jwt
        self.auth = Authenticator(config.tenants, JwtVerifier.load(jwt_settings) if jwt_settings else None)
        self.link_keys = _link_keys(config)
        self.signing_key = self.link_keys.current if self.link_keys else None  # readiness: was it read
        self.objects = objects.Objects(config.storage.s3)  # the store, for tenants with an s3 area
        self.fairness = Fairness()  # each tenant's request rate and requests in flight (controller/api/fairness.py)
        self.slow = SlowWork(config.api.slow_threads, config.api.slow_threads_per_tenant)  # controller/api/slow.py
        self.intake = Intake(config.data_root)  # accepted jobs handed over in batches (controller/api/intake.py)
        self.log = log.get(component="api")
        self.runner_ids = access.parse_ids(config.runner_uid_gid())
        self._areas: dict[tuple[str, object], Area] = {}  # names only: what the disk holds is looked at anew

    def area(self, tenant: Tenant) -> Area:
        """The tenant's area, its folders checked on every call (made when missing; a link or a file
        where one should be is refused), whatever was seen before."""
        key = (tenant.name, tenant.s3)
        area = self._areas.get(key)
        if area is None:
            area = self._areas[key] = Area(self.config.data_root, tenant.name, tenant.s3)
        area.ensure(self.runner_ids, self.config.controller_ids())
        return area

    def tenant(self, request: Request) -> Tenant:
        known = getattr(request.state, "tenant", None)  # found by the fairness gate already
        return known if isinstance(known, Tenant) else self.auth.tenant(request.headers.get("authorization"))

    def sweep(self) -> None:
        """Uploads whose receiving process is gone (``uploads/.incoming-*`` with no live lock, any
        replica's) are removed; at start and every minute (controller/api/sweep.py)."""
        for name in self.config.tenants:
            try:
                removed = sweep_uploads(self.config.data_root, name)
            except (OSError, FfswarmError) as e:  # one tenant's odd folder must not stop the others
                self.log.warning("api_upload_sweep_failed", tenant=name, error=type(e).__name__)
                continue
            if removed:
                self.log.info("api_uploads_swept", tenant=name, removed=len(removed))
            area = Area(self.config.data_root, name)
            idempotency.sweep(area)  # key records past their 24 h
            if quota.BOOK.give_back_orphans(self.config, area):
                self.log.info("api_quota_orphans_given_back", tenant=name)

    def link_owner(self, job: str) -> Area:
        """The area of the tenant a signed link's job belongs to: the run folder's ``owner`` once
        `serve` wrote it, else the tenant whose record holds it; 404 when none does."""
        root = self.config.data_root
        recorded = run_owner(root, job)
        names = [recorded] if recorded is not None else list(self.config.tenants)
        for name in names:
            if name in self.config.tenants and Area(root, name).owns(job) is not None:
                return Area(root, name, self.config.tenants[name].s3)
        raise not_found(job)

    def sign_link(self, area: Area, path: str, job: str, ttl: int) -> str | None:
        """``path`` signed for ``ttl`` seconds in the job's current link generation; None when links are off."""
        if self.link_keys is None:
            return None
        return links.sign(self.link_keys, "GET", path, ttl, links.generation(area.root, area.tenant, job))

    def link_area(self, request: Request, job: str) -> Area:
        """The owner's area of a job asked for by a signed link to this very path (key, signature,
        expiry within api.link_ttl), unless the job's links were revoked since the link was made."""
        q = request.query_params
        made = verify_link(self.link_keys, "GET", request.url.path, q, self.config.api.link_ttl)
        area = self.link_owner(job)
        check_link_generation(area.root, area.tenant, job, made)
        return area

    def links(self, area: Area, job: str) -> dict[str, Any]:
        url = self.sign_link(area, links.results_path(job), job, self.config.api.link_ttl)
        return {} if url is None else {"results_url": url}

    # --- routes -------------------------------------------------------------------------------

    def area_and_slot(self, tenant: Tenant) -> tuple[Area, quota.Reservation]:
        """The tenant's area and a job slot in it (429 when full), in one trip to a worker thread."""
        area = self.area(tenant)
        return area, quota.reserve(self.config, tenant, area)

    def accept_quick(self, tenant: Tenant, data: object) -> Staged[Accepted]:
        """A JSON submit naming a few files on the volume as one intake step (its slot, checks, hand-over)."""
        area = self.area(tenant)
        job = submit.json_id(area, data)  # first: the slot is made bound to it (one ledger transaction)
        slot = quota.reserve(self.config, tenant, area, job=job)
        try:
            job, text = submit.checked_json(self.config, area, data, job=job)
        except BaseException:
            slot.release()
            raise
        return accept.accept_json(self.config, area, job, text, slot)

    async def post_job(self, request: Request) -> Response:
        tenant = self.tenant(request)
        if media_type(request) != "application/json":
            return _accepted(await self.post_upload(request, tenant))
        data = json_body(await capped_body(request, MAX_JSON))
        if submit.quick(data):  # nothing slow to check: one trip, batched
            return _accepted(await self.intake.run(functools.partial(self.accept_quick, tenant, data)))
        area, slot = await asyncio.to_thread(self.area_and_slot, tenant)
        try:
            lane = self.slow.lane(tenant.name)
            if submit.walks(data):  # globs walked, a store listed, a pairs file read: in a worker process
                job, text = await lane.run_apart(submit.checked_json_apart, self.config, area, data)
            else:  # objects in the store looked at: on a slow thread, with this process's clients
                job, text = await lane.run(submit.checked_json, self.config, area, data, self.objects)
            step = functools.partial(accept.accept_json, self.config, area, job, text, slot)
            return _accepted(await self.intake.run(step))
        finally:
            if not slot.done:  # the slot given back unless the job was handed over (then nothing to do)
                await asyncio.to_thread(slot.release)

    def upload_slot(self, tenant: Tenant, declared: str | None) -> tuple[Area, quota.Reservation, Budget, str]:
        """An upload's area, job slot, byte budget and first id, in one trip; nothing held when refused."""
        area, slot = self.area_and_slot(tenant)
        try:
            budget = submit.request_budget(self.config, tenant, area, slot, declared)  # the declared bytes held
            return area, slot, budget, submit.fresh_id(area, "job")
        except BaseException:
            slot.release()
            raise

    async def post_upload(self, request: Request, tenant: Tenant) -> Accepted:
        media, declared = request.headers.get("content-type", ""), request.headers.get("content-length")
        area, slot, budget, job = await asyncio.to_thread(self.upload_slot, tenant, declared)
        try:
            staging = Staging(self.config.data_root, tenant.name, job)
            with staging:  # locked until it is moved or gone
                lane = self.slow.lane(tenant.name)  # the body written, unpacked and checked there
                up = await uploads.receive(media, declared, request.stream(), staging.staged, budget, lane)
                got = None
                if any(p.kind == "zip" for p in up.files if p.field == "targets"):  # unpacked in a worker process
                    got = await lane.run_apart(submit.unpack_targets, self.config, Lent(up.folder.fd), up.files, budget)
                rest = (self.config, area, slot, job, up, got or budget, staging, self.objects)
                return await lane.run(submit.finish_upload, *rest)
        finally:
            if not slot.done:
                await asyncio.to_thread(slot.release)

    async def list_jobs(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.area, self.tenant(request))
        query = Query(request.query_params)  # 400 naming every wrong field
        return JSONResponse(await asyncio.to_thread(list_page, self.config, area, query))

    async def get_job(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.area, self.tenant(request))
        return JSONResponse(await self.job_status(area, request.path_params["job"]))

    async def job_status(self, area: Area, job: str) -> dict[str, Any]:
        """The status object GET /v1/jobs/{job} answers: the job's status, its signed links, its outputs."""
        row = await asyncio.to_thread(views.job_view, self.config, area, job)
        outputs = await asyncio.to_thread(objects.job_links, self.config, area, job, self.objects)
        signed = await asyncio.to_thread(self.links, area, job)
        return {**row, **signed, **outputs}

    async def get_report(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.area, self.tenant(request))
        data = await asyncio.to_thread(views.report, self.config, area, request.path_params["job"])
        # links signed now (valid storage.s3.link_ttl from this answer), and only into the caller's area
        data = await asyncio.to_thread(objects.fresh_links, data, area, self.objects)
        return JSONResponse(data)

    async def cancel(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.area, self.tenant(request))
        return JSONResponse(await asyncio.to_thread(views.cancel, self.config, area, request.path_params["job"]))

    async def delete_job(self, request: Request) -> Response:
        """A finished job's files, outputs and records removed (controller/run/deletion.py); 204."""
        area = await asyncio.to_thread(self.area, self.tenant(request))
        await asyncio.to_thread(views.delete, self.config, area, request.path_params["job"])
        return Response(status_code=204)

    async def post_job_once(self, request: Request) -> Response:
        """POST /v1/jobs: with an Idempotency-Key, at most one job per tenant and key (idempotency.py);
        with ``Prefer: wait=N``, the final status when the job ends within N s (waiting.py)."""
        tenant = self.tenant(request)
        if request.headers.get("idempotency-key") is None:
            answer = await self.post_job(request)
        else:
            area = await asyncio.to_thread(self.area, tenant)
            answer = await idempotency.post_job(request, area, self.post_job, MAX_JSON, tenant.quota.upload)
        wait = preference(request.headers.getlist("prefer"))
        if wait is None:
            return answer
        area = await asyncio.to_thread(self.area, tenant)
        return await until_ended(answer, wait, area, lambda job: self.job_status(area, job))

    async def scale(self, request: Request) -> Response:
        tenant = self.tenant(request)
        area = await asyncio.to_thread(self.area, tenant)
        n = ops.parse_scale(await idempotency.read_body(request, ops.MAX_BODY, "the body is at most {cap} bytes"))
        job = request.path_params["job"]
        return JSONResponse(await asyncio.to_thread(ops.scale, self.config, tenant, area, job, n))

    async def retry(self, request: Request) -> Response:
        tenant = self.tenant(request)
        area = await asyncio.to_thread(self.area, tenant)
        out = await asyncio.to_thread(ops.retry, self.config, tenant, area, request.path_params["job"])
        return JSONResponse(out, status_code=202, headers={"Location": out["status_url"]})

    async def events(self, request: Request) -> Response:
        job = request.path_params["job"]
        area = await page.caller_area(self, request, job)  # a token, or a signed link (the web page's EventSource)
        return await event_stream.respond(self.config, area, job, request)

    async def results(self, request: Request) -> Response:
        job = request.path_params["job"]
        q = request.query_params
        if "sig" in q or "expires" in q:
            area = await asyncio.to_thread(self.link_area, request, job)
        else:
            area = await asyncio.to_thread(self.area, self.tenant(request))
        files, objs = await asyncio.to_thread(results.committed, self.config, area, job)
        return StreamingResponse(  # built piece by piece in the owner's share of the slow pool
            self.slow.lane(area.tenant).pieces(results.results_zip(self.config, area, job, files, objs, self.objects)),
            media_type="application/zip",
            headers={"Content-Disposition": f'attachment; filename="{job}.zip"'},
        )

    async def revoke_links(self, request: Request) -> Response:
        """Every link of the job made so far stops working; links made from now on work."""
        area = await asyncio.to_thread(self.area, self.tenant(request))
        job = request.path_params["job"]
        if await asyncio.to_thread(area.owns, job) is None:
            raise not_found(job)
        await asyncio.to_thread(links.revoke, area.root, area.tenant, job)
        return JSONResponse({"id": job, "links_revoked": True})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(document())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(self, request: Request) -> Response:
        """Whether this replica can serve (views.readiness); /healthz stays plain liveness. Without a
        token only ready or not: the reasons (which may name tenants) need a valid token."""
        caller = self.tenant(request) if request.headers.get("authorization") else None
        reasons = await asyncio.to_thread(views.readiness, self.config, self.signing_key)
        if reasons:
            body: dict[str, Any] = {"ready": False} if caller is None else {"ready": False, "reasons": reasons}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"ready": True})


def _link_keys(config: Config) -> links.SigningKeys | None:
    """The key links are signed with and the previous ones still accepted, read once at start."""
    key = config.api.signing_key_file
    if key is None:
        return None
    previous = config.api.previous_signing_key_files
    return links.SigningKeys(
        read_key_file(key, "api.signing_key_file").strip(),
        tuple(read_key_file(p, "api.previous_signing_key_files").strip() for p in previous),
    )


def _accepted(accepted: Accepted) -> Response:
    base = f"/v1/jobs/{accepted.job}"
    body: dict[str, Any] = {"id": accepted.job, "status_url": base, "events_url": f"{base}/events"}
    if accepted.notes:
        body["notes"] = list(accepted.notes)
    return JSONResponse(body, status_code=202, headers={"Location": base})


def make_app(config: Config) -> Starlette:
    api = Api(config)
    api.sweep()

    def g(handler: Handler) -> Handler:
        return guard(api.fairness.wrap(handler, api.auth), api.log)  # a tenant's limits before its body is read

    handlers = {  # operationId → handler; what each operation is, is in controller/api/openapi.py
        "createJob": api.post_job_once,
        "listJobs": api.list_jobs,
        "getJob": api.get_job,
        "deleteJob": api.delete_job,
        "getJobReport": api.get_report,
        "getJobEvents": api.events,
        "getJobResults": api.results,
        "cancelJob": api.cancel,
        "scaleJob": api.scale,
        "retryJob": api.retry,
        "revokeJobLinks": api.revoke_links,
        "getHealth": api.healthz,
        "getReadiness": api.readyz,
    }
    routes = [*table_routes({k: g(v) for k, v in handlers.items()}), Route("/openapi.json", g(api.openapi))]
    routes += page.routes(api, g)  # the web status page at / and its routes (controller/api/page.py)
    routes += api_usage.routes(api, g)  # GET /v1/usage (controller/api/usage.py)
    routes += api_deliveries.routes(api, g)  # a job's webhook deliveries (controller/api/deliveries.py)
    meter = ApiMetrics(api.auth, config.api.metrics_token_sha256)  # GET /metrics (controller/api/metrics.py)
    routes.append(meter.route(g))
    check_documented(routes)
    swept = every(api.sweep, on_error=lambda e: api.log.warning("api_upload_sweep_failed", error=type(e).__name__))
    metered = [meter.middleware()]  # requests by route template, code and latency
    handlers_ = {HTTPException: framework_error, Exception: framework_error}
    # the sweep again every minute while it serves, and threads enough for the requests in flight
    lifespan = _threads(swept, api.slow, api.intake)
    return Starlette(routes=routes, lifespan=lifespan, middleware=metered, exception_handlers=handlers_)


def _threads(
    inner: Callable[[Any], contextlib.AbstractAsyncContextManager[None]], slow: SlowWork, intake: Intake
) -> Any:
    """The lifespan ``inner`` with the slow pools (``slow``) and the intake threads started, and
    THREADS threads for the quick blocking work of requests (asyncio's default size)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="api"))
        slow.start()
        intake.start()
        try:
            async with inner(app):
                yield
        finally:
            intake.close()
            slow.close()

    return lifespan


def serve(config: Config, host: str, port: int, workers: int = 1) -> None:
    """Run the API on uvicorn until interrupted, in ``workers`` processes (controller/api/workers.py)."""
    warn_cluster_keys(config, "api")  # once, before the app is built and its workers forked
    if workers > 1:
        api_workers.run(lambda: make_app(config), host, port, workers)
        return
    uvicorn.run(make_app(config), host=host, port=port, log_level="warning", proxy_headers=False)


__all__ = ["Api", "make_app", "serve"]
