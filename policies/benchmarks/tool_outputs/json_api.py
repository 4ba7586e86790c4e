"""REST API responses as JSON: GitHub check runs and issues, Stripe charges, a Kubernetes pod list.

Each response is a list of similar records (pretty-printed as ``gh``/``kubectl``/``jq``
print them, or compact as the API sends them); the facts are the record the question
names (an issue about a topic, a customer's charge, a pod's node) or the records unlike
their siblings (a failed check run among successes, a declined charge, a crash-looping
pod).
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

from policies.benchmarks.tool_outputs._common import (
    ORGS,
    REGIONS,
    SERVICES,
    Clock,
    Unique,
    alnum,
    email,
    fill,
    hexid,
    ipv4,
    login,
    num_chars,
    plant,
    uuid4,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("github_checks", "github_issues", "stripe", "kubernetes")
_CHARS_PER_TOKEN = {"compact": 3.0, "pretty": 2.15, "kubernetes": 1.75}


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    pretty = fmt == "kubernetes" or rng.random() < 0.6
    mode = "kubernetes" if fmt == "kubernetes" else "pretty" if pretty else "compact"
    size = num_chars(rng, _CHARS_PER_TOKEN[mode])
    body, tool, arguments, question, facts = _BUILDERS[fmt](rng, size)
    text = (
        json.dumps(body, indent=4 if fmt == "kubernetes" else 2)
        if pretty
        else json.dumps(body, separators=(",", ":"))
    )
    return Case("json", fmt, tool, arguments, question, text, tuple(facts))


# -- GitHub ----------------------------------------------------------------------------------
_JOBS = ("test", "integration", "e2e", "build", "lint", "typecheck", "docs", "bench")
_MATRIX = (
    "ubuntu-22.04, 3.10",
    "ubuntu-22.04, 3.11",
    "ubuntu-22.04, 3.12",
    "macos-14, 3.12",
    "windows-2022, 3.11",
    "linux/amd64",
    "linux/arm64",
    "node 18",
    "node 20",
    "postgres 15",
    "postgres 16",
)


def _github_checks(rng: random.Random, size: int) -> tuple:
    owner, repo = rng.choice(ORGS), rng.choice(SERVICES)
    sha = hexid(rng, 40)
    clock = Clock(rng, step_s=(1, 40))
    names = Unique()
    app = {
        "id": 15368,
        "slug": "github-actions",
        "node_id": "MDM6QXBwMTUzNjg=",
        "owner": {"login": "github", "id": 9919, "type": "Organization"},
        "name": "GitHub Actions",
        "description": "Automate your workflow from idea to production",
        "external_url": "https://help.github.com/en/actions",
        "html_url": "https://github.com/apps/github-actions",
        "created_at": "2018-07-30T09:30:17Z",
        "updated_at": "2019-12-10T19:04:12Z",
        "permissions": {"actions": "write", "checks": "write", "contents": "write"},
        "events": ["check_run", "check_suite", "pull_request", "push", "workflow_dispatch"],
    }

    def check_run(conclusion: str) -> dict[str, Any]:
        job = rng.choice(_JOBS)
        shard = f", shard {rng.randint(1, 16)}/16" if job in ("test", "e2e") else ""
        name = names(lambda: f"{job} ({rng.choice(_MATRIX)}{shard})")
        run_id, job_id = rng.randrange(7_000_000_000, 9_000_000_000), rng.randrange(10**10, 10**11)
        start = clock.tick()
        done = start + timedelta(seconds=rng.randint(20, 1_500))
        return {
            "id": job_id,
            "name": name,
            "node_id": "CR_kwDO" + alnum(rng, 20),
            "head_sha": sha,
            "external_id": uuid4(rng),
            "url": f"https://api.github.com/repos/{owner}/{repo}/check-runs/{job_id}",
            "html_url": f"https://github.com/{owner}/{repo}/actions/runs/{run_id}/job/{job_id}",
            "details_url": f"https://github.com/{owner}/{repo}/actions/runs/{run_id}/job/{job_id}",
            "status": "completed",
            "conclusion": conclusion,
            "started_at": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "completed_at": done.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "output": {
                "title": None,
                "summary": None,
                "text": None,
                "annotations_count": int(conclusion == "failure") + rng.choice((0, 0, 1)),
                "annotations_url": f"https://api.github.com/repos/{owner}/{repo}/check-runs/"
                f"{job_id}/annotations",
            },
            "check_suite": {"id": rng.randrange(10**10, 10**11)},
            "app": app,
            "pull_requests": [],
        }

    runs = fill(
        lambda: check_run(rng.choice(("success",) * 8 + ("skipped", "neutral"))),
        size,
        lambda r: len(json.dumps(r)),
    )
    failed = [check_run("failure") for _ in range(rng.choice((1, 1, 2)))]
    plant(rng, runs, failed)
    body = {"total_count": len(runs), "check_runs": runs}
    short = sha[:7]
    question = rng.choice(
        (
            f"CI is red on {short}. Which check failed?",
            f"The PR's head commit {short} shows a failing status; find the failing job so we "
            "can open its log.",
            "Before merging, can you confirm every check passed on the latest commit?",
        )
    )
    arguments = {
        "url": f"https://api.github.com/repos/{owner}/{repo}/commits/{sha}/check-runs?per_page=100"
    }
    facts = [
        Fact((r["name"], "failure"), "standout", f"check run {r['name']} failed") for r in failed
    ]
    return body, "http_get", arguments, question, facts


_ISSUE_PARTS = (
    ("exporter", "the CSV exporter"),
    ("scheduler", "the job scheduler"),
    ("webhooks", "webhook delivery"),
    ("auth", "the login flow"),
    ("search", "search indexing"),
    ("billing", "invoice generation"),
    ("cli", "the command-line tool"),
    ("sync", "the calendar sync"),
    ("uploads", "file uploads"),
    ("api", "the public API"),
)
_PROBLEMS = (
    ("runs out of memory on large tenants", "running out of memory"),
    ("times out after upgrading to 3.2", "timing out since the 3.2 upgrade"),
    ("drops events under load", "losing events under load"),
    ("returns 500 for unicode names", "failing on unicode names"),
    ("ignores the proxy settings", "ignoring the proxy settings"),
    ("leaks file descriptors", "leaking file descriptors"),
    ("double-counts retries", "double-counting retries"),
    ("breaks with daylight saving time", "breaking around daylight saving time"),
)
_LABELS = (
    "bug",
    "enhancement",
    "needs-triage",
    "p1",
    "p2",
    "good first issue",
    "regression",
    "documentation",
    "performance",
    "security",
)


def _github_issues(rng: random.Random, size: int) -> tuple:
    owner, repo = rng.choice(ORGS), rng.choice(SERVICES)
    (area, area_words), (problem, problem_words) = rng.choice(_ISSUE_PARTS), rng.choice(_PROBLEMS)
    clock = Clock(rng, step_s=(600, 30_000))

    def issue(title: str, assignee: str | None) -> dict[str, Any]:
        n = 0  # numbered once planted, newest first as the API lists them
        user = login(rng)
        created = clock.tick()
        url = f"https://api.github.com/repos/{owner}/{repo}/issues/{n}"
        person = (
            None
            if assignee is None
            else {
                "login": assignee,
                "id": rng.randrange(10**6, 10**8),
                "avatar_url": f"https://avatars.githubusercontent.com/u/{rng.randrange(10**7)}?v=4",
                "type": "User",
                "site_admin": False,
            }
        )
        return {
            "url": url,
            "repository_url": f"https://api.github.com/repos/{owner}/{repo}",
            "html_url": f"https://github.com/{owner}/{repo}/issues/{n}",
            "id": rng.randrange(10**9, 3 * 10**9),
            "node_id": "I_kwDO" + alnum(rng, 16),
            "number": n,
            "title": title,
            "user": {"login": user, "id": rng.randrange(10**6, 10**8), "type": "User"},
            "labels": [
                {"name": name, "color": hexid(rng, 6), "default": name == "bug"}
                for name in rng.sample(_LABELS, rng.randint(0, 3))
            ],
            "state": "open",
            "locked": False,
            "assignee": person,
            "assignees": [] if person is None else [person],
            "comments": rng.randint(0, 40),
            "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "updated_at": (created + timedelta(hours=rng.randint(1, 900))).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "author_association": rng.choice(("MEMBER", "CONTRIBUTOR", "NONE")),
            "body": f"Steps to reproduce are in the linked thread. Seen on {rng.choice(REGIONS)} "
            f"since build {hexid(rng, 7)}.",
        }

    def other_title() -> str:
        while True:
            (a, _), (p, _) = rng.choice(_ISSUE_PARTS), rng.choice(_PROBLEMS)
            if (a, p) != (area, problem):
                return rng.choice(
                    (
                        f"{a}: {p}",
                        f"[{a}] {p} on {rng.choice(REGIONS)}",
                        f"{a}: {p} (regression in 3.{rng.randint(0, 9)})",
                        f"{a.title()} {p} when the tenant has SSO enabled",
                    )
                )

    issues = fill(
        lambda: issue(other_title(), rng.choice((None, login(rng)))),
        size,
        lambda r: len(json.dumps(r)),
    )
    owner_login = Unique(i["assignee"]["login"] for i in issues if i["assignee"])(
        lambda: login(rng)
    )
    target = issue(f"{area}: {problem}", owner_login)
    plant(rng, issues, [target])
    _renumber(issues, owner, repo, rng.randint(3_000, 9_000))
    question = rng.choice(
        (
            f"Is there already an open issue about {area_words} {problem_words}? Who's on it?",
            f"Someone reported {area_words} {problem_words}; find the issue number and assignee.",
        )
    )
    arguments = {
        "url": f"https://api.github.com/repos/{owner}/{repo}/issues?state=open"
        "&per_page=100&sort=created"
    }
    fact = Fact(
        (str(target["number"]), owner_login),
        "asked",
        f"issue #{target['number']} about {area} is assigned to {owner_login}",
    )
    return issues, "http_get", arguments, question, [fact]


def _renumber(issues: list[dict[str, Any]], owner: str, repo: str, top: int) -> None:
    for offset, each in enumerate(issues):
        n = top - offset
        each["number"] = n
        each["url"] = f"https://api.github.com/repos/{owner}/{repo}/issues/{n}"
        each["html_url"] = f"https://github.com/{owner}/{repo}/issues/{n}"


# -- Stripe ----------------------------------------------------------------------------------
_DECLINES = (
    ("card_declined", "Your card was declined."),
    ("insufficient_funds", "Your card has insufficient funds."),
    ("expired_card", "Your card has expired."),
    ("incorrect_cvc", "Your card's security code is incorrect."),
    (
        "processing_error",
        "An error occurred while processing your card. Try again in a little bit.",
    ),
)


def _stripe(rng: random.Random, size: int) -> tuple:
    clock = Clock(rng, step_s=(5, 400))
    customers, charges_ids = Unique(), Unique()

    def charge(customer: str, failure: tuple[str, str] | None = None) -> dict[str, Any]:
        amount = rng.choice((900, 1_200, 1_900, 2_900, 4_900, 9_900)) * rng.randint(
            1, 6
        ) + rng.choice((0, 0, 0, 50, 99))
        created = int(clock.tick().timestamp())
        cid = charges_ids(lambda: "ch_3" + alnum(rng, 23))
        last4 = f"{rng.randrange(10_000):04d}"
        return {
            "id": cid,
            "object": "charge",
            "amount": amount,
            "amount_captured": 0 if failure else amount,
            "amount_refunded": 0,
            "balance_transaction": None if failure else "txn_3" + alnum(rng, 23),
            "billing_details": {
                "address": {
                    "country": rng.choice(("US", "DE", "FR", "GB", "JP")),
                    "postal_code": str(rng.randint(10_000, 99_999)),
                },
                "email": email(rng),
                "name": None,
                "phone": None,
            },
            "captured": failure is None,
            "created": created,
            "currency": rng.choice(("usd", "usd", "eur", "gbp")),
            "customer": customer,
            "description": f"Subscription update {rng.choice(('monthly', 'annual'))}",
            "failure_code": failure[0] if failure else None,
            "failure_message": failure[1] if failure else None,
            "livemode": True,
            "metadata": {"order_id": f"ord_{rng.randrange(10**7, 10**8)}"},
            "outcome": {
                "network_status": "declined_by_network" if failure else "approved_by_network",
                "risk_level": "normal",
                "risk_score": rng.randint(2, 60),
                "seller_message": "The bank did not return any further details with this decline."
                if failure
                else "Payment complete.",
                "type": "issuer_declined" if failure else "authorized",
            },
            "paid": failure is None,
            "payment_intent": "pi_3" + alnum(rng, 23),
            "payment_method": "pm_1" + alnum(rng, 23),
            "payment_method_details": {
                "card": {
                    "brand": rng.choice(("visa", "mastercard", "amex")),
                    "country": "US",
                    "exp_month": rng.randint(1, 12),
                    "exp_year": rng.randint(2025, 2031),
                    "funding": "credit",
                    "last4": last4,
                    "network": "visa",
                    "checks": {"address_postal_code_check": "pass", "cvc_check": "pass"},
                },
                "type": "card",
            },
            "receipt_url": None
            if failure
            else "https://pay.stripe.com/receipts/payment/" + alnum(rng, 40),
            "refunded": False,
            "status": "failed" if failure else "succeeded",
        }

    new_customer = lambda: customers(lambda: "cus_" + alnum(rng, 14))  # noqa: E731
    data = fill(lambda: charge(new_customer()), size, lambda r: len(json.dumps(r)))
    if rng.random() < 0.5:
        target = charge(new_customer())
        plant(rng, data, [target])
        question = rng.choice(
            (
                f"Did the charge for customer {target['customer']} go through, and for how much?",
                f"Customer {target['customer']} says they were billed twice. What did we charge "
                "them "
                "today?",
            )
        )
        facts = [
            Fact(
                (target["id"], str(target["amount"])),
                "asked",
                f"{target['customer']}'s charge {target['id']} of {target['amount']}",
            )
        ]
    else:
        failed = [charge(new_customer(), rng.choice(_DECLINES)) for _ in range(rng.randint(1, 2))]
        plant(rng, data, failed)
        question = rng.choice(
            (
                "Some payments failed in the last hour. Which charges failed and why?",
                "Finance says a renewal bounced overnight; what happened?",
            )
        )
        facts = [
            Fact(
                (c["id"], c["failure_code"]),
                "standout",
                f"charge {c['id']} failed with {c['failure_code']}",
            )
            for c in failed
        ]
    created = int(clock.tick().timestamp())
    for each in data:  # newest first, as the API lists them
        created -= rng.randint(5, 400)
        each["created"] = created
    body = {"object": "list", "data": data, "has_more": True, "url": "/v1/charges"}
    arguments = {
        "method": "GET",
        "path": "/v1/charges",
        "params": {"limit": 100, "created[gte]": data[-1]["created"]},
    }
    return body, "stripe_api", arguments, question, facts


# -- Kubernetes ------------------------------------------------------------------------------
def _kubernetes(rng: random.Random, size: int) -> tuple:
    namespace = rng.choice(("prod", "production", "default", "payments", "platform"))
    nodes = [
        f"ip-10-{rng.randrange(256)}-{rng.randrange(256)}-{rng.randrange(256)}."
        f"{rng.choice(REGIONS)}.compute.internal"
        for _ in range(rng.randint(4, 12))
    ]
    names, ips = Unique(), Unique()
    clock = Clock(rng, step_s=(60, 9_000))

    def pod(app: str, waiting: str | None = None) -> dict[str, Any]:
        rs = alnum(rng, 10, lower=True)
        name = names(lambda: f"{app}-{rs}-{alnum(rng, 5, lower=True)}")
        started = clock.tick().strftime("%Y-%m-%dT%H:%M:%SZ")
        image = f"123456789012.dkr.ecr.{rng.choice(REGIONS)}.amazonaws.com/{app}:{hexid(rng, 7)}"
        restarts = rng.randint(14, 80) if waiting else rng.choice((0, 0, 0, 1, 2))
        state: dict[str, Any] = {"running": {"startedAt": started}}
        last: dict[str, Any] = {}
        if waiting:
            state = {
                "waiting": {
                    "reason": waiting,
                    "message": f"back-off 5m0s restarting failed "
                    f"container={app} pod={name}_{namespace}({uuid4(rng)})",
                }
            }
            last = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "OOMKilled",
                    "startedAt": started,
                    "finishedAt": started,
                    "containerID": "containerd://" + hexid(rng, 64),
                }
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "creationTimestamp": started,
                "generateName": f"{app}-{rs}-",
                "labels": {"app.kubernetes.io/name": app, "pod-template-hash": rs},
                "name": name,
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "blockOwnerDeletion": True,
                        "controller": True,
                        "kind": "ReplicaSet",
                        "name": f"{app}-{rs}",
                        "uid": uuid4(rng),
                    }
                ],
                "resourceVersion": str(rng.randrange(10**8, 10**9)),
                "uid": uuid4(rng),
            },
            "spec": {
                "containers": [
                    {
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "name": app,
                        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                        "resources": {
                            "limits": {"memory": f"{rng.choice((256, 512, 1024))}Mi"},
                            "requests": {
                                "cpu": f"{rng.choice((100, 250, 500))}m",
                                "memory": f"{rng.choice((128, 256))}Mi",
                            },
                        },
                        "terminationMessagePath": "/dev/termination-log",
                    }
                ],
                "dnsPolicy": "ClusterFirst",
                "nodeName": rng.choice(nodes),
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "serviceAccountName": app,
                "terminationGracePeriodSeconds": 30,
            },
            "status": {
                "conditions": [
                    {
                        "lastProbeTime": None,
                        "lastTransitionTime": started,
                        "status": "False" if waiting and kind == "Ready" else "True",
                        "type": kind,
                    }
                    for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                ],
                "containerStatuses": [
                    {
                        "containerID": "containerd://" + hexid(rng, 64),
                        "image": image,
                        "imageID": image + "@sha256:" + hexid(rng, 64),
                        "lastState": last,
                        "name": app,
                        "ready": waiting is None,
                        "restartCount": restarts,
                        "started": waiting is None,
                        "state": state,
                    }
                ],
                "hostIP": ipv4(rng),
                "phase": "Running",
                "podIP": ips(lambda: ipv4(rng)),
                "qosClass": "Burstable",
                "startTime": started,
            },
        }

    apps = rng.sample(SERVICES, 8)
    pods = fill(lambda: pod(rng.choice(apps)), size, lambda r: len(json.dumps(r)))
    if rng.random() < 0.5:
        app = rng.choice(("redis-primary", "kafka-broker-0", "vault-agent", "pgbouncer"))
        target = pod(app)
        plant(rng, pods, [target])
        question = rng.choice(
            (
                f"Which node is the {app} pod on, and what's its pod IP?",
                f"I need to exec into {app}; where is it scheduled?",
            )
        )
        node, ip = target["spec"]["nodeName"], target["status"]["podIP"]
        facts = [
            Fact((target["metadata"]["name"], node, ip), "asked", f"{app} runs on {node} at {ip}")
        ]
    else:
        broken = [pod(rng.choice(apps), "CrashLoopBackOff") for _ in range(rng.randint(1, 2))]
        plant(rng, pods, broken)
        question = rng.choice(
            (
                f"Something in {namespace} is unhealthy; which pods are failing?",
                f"Alerts say a pod in {namespace} keeps restarting. Which one?",
            )
        )
        facts = [
            Fact(
                (p["metadata"]["name"], "CrashLoopBackOff"),
                "standout",
                f"{p['metadata']['name']} is crash-looping (OOMKilled)",
            )
            for p in broken
        ]
    body = {"apiVersion": "v1", "items": pods, "kind": "List", "metadata": {"resourceVersion": ""}}
    arguments = {"command": f"kubectl get pods -n {namespace} -o json"}
    return body, "shell", arguments, question, facts


_BUILDERS = {
    "github_checks": _github_checks,
    "github_issues": _github_issues,
    "stripe": _stripe,
    "kubernetes": _kubernetes,
}
