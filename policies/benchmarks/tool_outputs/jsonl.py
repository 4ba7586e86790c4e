"""JSON-lines event logs: OpenTelemetry span exports, CloudTrail-style audit events, structlog.

One JSON object per line. The facts are the line the question names (a trace's slowest
span, who deleted a bucket, a request's failure) or the error among thousands of routine
events.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    REGIONS,
    SERVICES,
    Clock,
    Unique,
    alnum,
    fill,
    hexid,
    ipv4,
    iso_ms,
    login,
    num_chars,
    plant,
    uuid4,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("otel_spans", "cloudtrail", "structlog")
_CHARS_PER_TOKEN = {"otel_spans": 2.2, "cloudtrail": 2.65, "structlog": 2.6}


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    lines, tool, arguments, question, facts = _BUILDERS[fmt](rng, size)
    text = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines) + "\n"
    return Case("jsonl", fmt, tool, arguments, question, text, tuple(facts))


def _size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":")))


# -- OpenTelemetry spans ---------------------------------------------------------------------
_ROUTES = (
    "/api/v1/orders",
    "/api/v1/orders/{id}",
    "/api/v1/carts/{id}/items",
    "/api/v1/search",
    "/api/v1/customers/{id}",
    "/api/v1/invoices/{id}/pdf",
    "/healthz",
)
_DB_OPS = (
    "SELECT orders",
    "SELECT customers",
    "INSERT order_items",
    "UPDATE carts",
    "SELECT invoices",
    "SELECT prices",
)
_SLOW = (
    "pg.query invoices.select_by_account",
    "redis GET session",
    "http POST payments/authorize",
    "s3 PutObject exports",
    "pg.query ledger.lock_rows",
)
_SPAN_ERRORS = (
    "context deadline exceeded after 5000ms",
    "connection reset by peer",
    "pq: could not serialize access due to concurrent update",
    "upstream payments returned 503",
    "dial tcp 10.0.4.17:6379: i/o timeout",
)


def _otel(rng: random.Random, size: int) -> tuple:
    clock = Clock(rng, step_s=(0.0, 0.4))
    service = rng.choice(SERVICES)

    def trace(slow: str | None = None, error: str | None = None) -> list[dict[str, Any]]:
        trace_id, root_id = hexid(rng, 32), hexid(rng, 16)
        start = clock.tick()
        route = rng.choice(_ROUTES)
        children = []
        for i in range(rng.randint(2, 6)):
            name = rng.choice(_DB_OPS) if i else "redis GET session"
            duration = round(rng.lognormvariate(1.2, 0.8), 2)
            status = {"code": "STATUS_CODE_UNSET"}
            events: list[dict[str, Any]] = []
            if slow is not None and i == 1:
                name, duration = slow, round(rng.uniform(2_500, 9_000), 2)
            if error is not None and i == 1:
                status = {"code": "STATUS_CODE_ERROR", "message": error}
                events = [
                    {
                        "name": "exception",
                        "timeUnixNano": str(int(start.timestamp() * 1e9)),
                        "attributes": {"exception.type": "Error", "exception.message": error},
                    }
                ]
            children.append(
                _span(
                    rng,
                    trace_id,
                    root_id,
                    name,
                    start,
                    duration,
                    status,
                    events,
                    service,
                    {"db.system": "postgresql"},
                )
            )
        total = round(sum(c["duration_ms"] for c in children) + rng.uniform(1, 15), 2)
        root = _span(
            rng,
            trace_id,
            None,
            f"GET {route}",
            start,
            total,
            {"code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_UNSET"},
            [],
            service,
            {"http.method": "GET", "http.route": route, "http.status_code": 500 if error else 200},
        )
        root["span_id"] = root_id
        return [*children, root]  # children end first, as exporters write them

    traces = fill(trace, size, lambda t: sum(_size(s) for s in t))
    if rng.random() < 0.5:
        target = trace(slow=rng.choice(_SLOW))
        plant(rng, traces, [target])
        slow_span = target[1]
        tid = slow_span["trace_id"]
        question = rng.choice(
            (
                f"Why was trace {tid} so slow?",
                f"A customer request took seconds (trace id {tid}). Which span took the time?",
            )
        )
        facts = [
            Fact(
                (tid, slow_span["name"], str(slow_span["duration_ms"])),
                "asked",
                f"span {slow_span['name']} took {slow_span['duration_ms']} ms",
            )
        ]
    else:
        errors = rng.sample(_SPAN_ERRORS, rng.randint(1, 2))
        targets = [trace(error=e) for e in errors]
        plant(rng, traces, targets)
        question = rng.choice(
            (
                f"Error rate on {service} spiked; find the failing spans in this export.",
                "Are there any errored spans in the last export?",
            )
        )
        facts = [
            Fact((t[1]["trace_id"], e), "standout", f"span in trace {t[1]['trace_id']}: {e}")
            for t, e in zip(targets, errors, strict=True)
        ]
    for each in traces:  # stamped in the order they were written, once planted
        start = clock.tick()
        for span in each:
            span["start_time"] = iso_ms(start)
            span["end_time"] = iso_ms(start + timedelta(milliseconds=span["duration_ms"]))
    day = clock.now.strftime("%Y-%m-%d")
    arguments = {"path": f"/var/lib/otelcol/export/{service}-spans-{day}.jsonl"}
    return [s for t in traces for s in t], "read_file", arguments, question, facts


def _span(
    rng: random.Random,
    trace_id: str,
    parent: str | None,
    name: str,
    start: Any,
    duration: float,
    status: dict[str, str],
    events: list[dict[str, Any]],
    service: str,
    attributes: dict[str, Any],
) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "span_id": hexid(rng, 16),
        "parent_span_id": parent or "",
        "name": name,
        "kind": "SPAN_KIND_CLIENT" if parent else "SPAN_KIND_SERVER",
        "start_time": iso_ms(start),
        "end_time": iso_ms(start + timedelta(milliseconds=duration)),
        "duration_ms": duration,
        "status": status,
        "events": events,
        "resource": {
            "service.name": service,
            "service.version": f"2.{rng.randint(10, 40)}.0",
            "k8s.pod.name": f"{service}-7d9f8c-{alnum(rng, 5, lower=True)}",
        },
        "attributes": attributes,
    }


# -- CloudTrail ------------------------------------------------------------------------------
_S3_READS = ("GetObject", "HeadObject", "ListObjectsV2", "GetBucketLocation", "GetBucketPolicy")
_S3_WRITES = ("PutObject", "DeleteObject", "PutBucketTagging", "CreateMultipartUpload")


def _cloudtrail(rng: random.Random, size: int) -> tuple:
    clock = Clock(rng, step_s=(0.0, 3.0))
    region = rng.choice(REGIONS)
    org = rng.choice(("acme", "globex", "initech"))
    buckets = [
        f"{org}-{noun}-{rng.choice(('prod', 'staging', 'eu', 'us', 'archive'))}"
        for noun in rng.sample(NOUNS, 10)
    ]
    users = Unique()
    people = [users(lambda: login(rng)) for _ in range(12)]

    def event(name: str, user: str, bucket: str, error: str | None = None) -> dict[str, Any]:
        record: dict[str, Any] = {
            "eventVersion": "1.09",
            "userIdentity": {
                "type": "IAMUser",
                "principalId": "AIDA" + alnum(rng, 17).upper(),
                "arn": f"arn:aws:iam::123456789012:user/{user}",
                "accountId": "123456789012",
                "userName": user,
            },
            "eventTime": clock.tick().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "eventSource": "s3.amazonaws.com",
            "eventName": name,
            "awsRegion": region,
            "sourceIPAddress": ipv4(rng, private=False),
            "userAgent": rng.choice(
                (
                    "[aws-cli/2.15.30 Python/3.11.8 Linux/6.1]",
                    "[Boto3/1.34.69 md/Botocore#1.34.69 ua/2.0 os/linux]",
                    "[S3Console/0.4]",
                )
            ),
            "requestParameters": {"bucketName": bucket, "Host": f"{bucket}.s3.amazonaws.com"},
            "responseElements": None,
            "requestID": alnum(rng, 16).upper(),
            "eventID": uuid4(rng),
            "readOnly": name in _S3_READS,
            "eventType": "AwsApiCall",
            "recipientAccountId": "123456789012",
        }
        if name not in ("DeleteBucket", "GetBucketLocation", "GetBucketPolicy", "PutBucketTagging"):
            record["requestParameters"]["key"] = f"{rng.choice(NOUNS)}s/{uuid4(rng)}.json"
        if error:
            record["errorCode"] = error
            record["errorMessage"] = "Access Denied"
        return record

    routine = lambda: event(  # noqa: E731
        rng.choice(_S3_READS * 3 + _S3_WRITES), rng.choice(people), rng.choice(buckets)
    )
    events = fill(routine, size, _size)
    culprit = users(lambda: login(rng))
    bucket = rng.choice(buckets)
    if rng.random() < 0.5:
        gone = event("DeleteBucket", culprit, bucket)
        plant(rng, events, [gone])
        question = rng.choice(
            (
                f"Who deleted the bucket {bucket}?",
                f"{bucket} disappeared this morning. Find out who removed it.",
            )
        )
        facts = [Fact((bucket, "DeleteBucket", culprit), "asked", f"{culprit} deleted {bucket}")]
    else:
        denied = event("PutObject", culprit, bucket, error="AccessDenied")
        plant(rng, events, [denied])
        question = rng.choice(
            (
                "Someone's uploads are being rejected; find any failed S3 calls in the trail.",
                "Are there denied requests in today's trail? Who and on which bucket?",
            )
        )
        facts = [
            Fact(
                (culprit, "AccessDenied", bucket),
                "standout",
                f"{culprit} was denied PutObject on {bucket}",
            )
        ]
    for each in events:  # stamped in order, once planted
        each["eventTime"] = clock.tick().strftime("%Y-%m-%dT%H:%M:%SZ")
    day = clock.now.strftime("%Y/%m/%d")
    arguments = {
        "command": f"aws s3 cp s3://{org}-cloudtrail/AWSLogs/123456789012/CloudTrail/"
        f"{region}/{day}/ - --recursive | gunzip | jq -c '.Records[]'"
    }
    return events, "shell", arguments, question, facts


# -- structlog -------------------------------------------------------------------------------
_EVENTS = (
    "request started",
    "request finished",
    "cart loaded",
    "price computed",
    "cache miss",
    "cache hit",
    "payment authorized",
    "order created",
    "email queued",
    "inventory reserved",
    "session refreshed",
)
_FAILURES = (
    ("payment capture failed", "gateway timeout after 30000ms"),
    (
        "order create failed",
        "duplicate key value violates unique constraint orders_external_id_key",
    ),
    ("inventory reservation failed", "sku out of stock at warehouse fra-2"),
    ("webhook delivery failed", "remote returned 410 Gone"),
    ("invoice render failed", "template variable tax_rate is undefined"),
)


def _structlog(rng: random.Random, size: int) -> tuple:
    clock = Clock(rng, step_s=(0.0, 0.5))
    service = rng.choice(SERVICES)
    request_ids = Unique()

    def line(request_id: str, event: str, level: str = "info", **extra: Any) -> dict[str, Any]:
        return {
            "timestamp": iso_ms(clock.tick()),
            "level": level,
            "logger": f"{service}.{rng.choice(('api', 'handlers', 'workers', 'db'))}",
            "event": event,
            "request_id": request_id,
            "user_id": rng.randint(10_000, 999_999),
            "duration_ms": round(rng.lognormvariate(2.5, 0.9), 1),
            **extra,
        }

    new_request = lambda: request_ids(lambda: "req_" + alnum(rng, 20))  # noqa: E731
    lines = fill(lambda: line(new_request(), rng.choice(_EVENTS)), size, _size)
    failures = rng.sample(_FAILURES, rng.randint(1, 2))
    targets = []
    for event, error in failures:
        rid = new_request()
        targets.append((rid, error))
        plant(rng, lines, [line(rid, event, "error", error=error, exc_info=True)])
        for _ in range(rng.randint(1, 3)):  # the same request's routine lines elsewhere
            plant(rng, lines, [line(rid, rng.choice(_EVENTS))])
    for each in lines:  # stamped in order, once planted
        each["timestamp"] = iso_ms(clock.tick())
    asked = rng.random() < 0.5
    if asked:
        rid = targets[0][0]
        question = rng.choice(
            (
                f"What happened to request {rid}?",
                f"Support ticket mentions request id {rid}; did it fail, and why?",
            )
        )
    else:
        question = rng.choice(
            (
                f"Are there errors in the {service} logs from the last hour?",
                f"{service} returned 500s for a few minutes; what failed?",
            )
        )
    facts = [
        Fact(
            (rid, error),
            "asked" if asked and i == 0 else "standout",
            f"request {rid} failed: {error}",
        )
        for i, (rid, error) in enumerate(targets)
    ]
    if asked:
        facts = facts[:1]
    arguments = {"command": f"kubectl logs deploy/{service} -n prod --since=1h"}
    return lines, "shell", arguments, question, facts


_BUILDERS = {"otel_spans": _otel, "cloudtrail": _cloudtrail, "structlog": _structlog}
