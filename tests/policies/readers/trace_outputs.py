"""Logs holding stack traces as services print them (Python, Java with Spring, Node, Go),
for the traces reader's tests: 3,000 tokens and more, the traces among ordinary entries.
Each builder takes a seed and returns the text; the tests find what they expect in it."""

from __future__ import annotations

import random


def _entries(rng: random.Random, n: int, start: int = 0) -> list[str]:
    out = []
    for i in range(start, start + n):
        stamp = f"2026-03-04 10:{i // 60 % 60:02d}:{i % 60:02d},{rng.randint(0, 999):03d}"
        if rng.random() < 0.7:
            took = rng.randint(3, 300)
            out.append(f"{stamp} INFO  [worker-{i % 4}] orders.api GET /orders/{i} 200 {took}ms")
        else:
            out.append(f"{stamp} DEBUG [worker-{i % 4}] cache hit key=cart:{rng.randint(1, 9999)}")
    return out


def python_log(seed: int, *, entries: int = 160) -> str:
    """A worker's log with one chained Python traceback in the middle."""
    rng = random.Random(seed)
    before = _entries(rng, entries // 2)
    trace = [
        "2026-03-04 10:01:20,114 ERROR [worker-2] billing.jobs job charge_order failed",
        "Traceback (most recent call last):",
        '  File "/app/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 477, in '
        "trace_task",
        "    R = retval = fun(*args, **kwargs)",
        '  File "/app/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 760, in '
        "__protected_call__",
        "    return self.run(*args, **kwargs)",
        '  File "/app/billing/jobs.py", line 88, in charge_order',
        "    total = invoice_total(order)",
        '  File "/app/billing/invoice.py", line 41, in invoice_total',
        "    return sum(line.amount for line in order.lines) / order.num_items",
        "ZeroDivisionError: division by zero",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/app/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 477, in '
        "trace_task",
        "    R = retval = fun(*args, **kwargs)",
        '  File "/app/billing/jobs.py", line 92, in charge_order',
        '    raise ChargeError(f"order {order.id} has no items") from exc',
        "billing.errors.ChargeError: order ord_48213 has no items",
    ]
    after = _entries(rng, entries // 2, entries // 2)
    return "\n".join(before + trace + after)


SPRING_FRAMES = (
    "org.springframework.web.servlet.FrameworkServlet.processRequest(FrameworkServlet.java:1014)",
    "org.springframework.web.servlet.DispatcherServlet.doDispatch(DispatcherServlet.java:1089)",
    "org.springframework.web.servlet.DispatcherServlet.doService(DispatcherServlet.java:979)",
    "jakarta.servlet.http.HttpServlet.service(HttpServlet.java:590)",
    "org.apache.catalina.core.ApplicationFilterChain.doFilter(ApplicationFilterChain.java:166)",
    "org.springframework.web.filter.OncePerRequestFilter.doFilter(OncePerRequestFilter.java:116)",
    "org.apache.tomcat.util.net.SocketProcessorBase.run(SocketProcessorBase.java:52)",
    "java.base/java.util.concurrent.ThreadPoolExecutor.runWorker(ThreadPoolExecutor.java:1144)",
    "java.base/java.lang.Thread.run(Thread.java:1583)",
)


def java_log(seed: int, *, entries: int = 120, spring: int = 40) -> str:
    """A Spring service's log: one request fails with a cause chain under many frames."""
    rng = random.Random(seed)
    frames = [f"\tat {rng.choice(SPRING_FRAMES)}" for _ in range(spring)]
    trace = [
        "2026-03-04 10:02:03,551 ERROR [http-nio-8080-exec-7] o.a.c.c.C.[dispatcherServlet] - "
        "Servlet.service() threw exception",
        "com.acme.orders.OrderLookupException: could not load order ord_77001",
        "\tat com.acme.orders.OrderService.find(OrderService.java:88)",
        "\tat com.acme.orders.OrderController.get(OrderController.java:41)",
        "\tat java.base/jdk.internal.reflect.DirectMethodHandleAccessor.invoke("
        "DirectMethodHandleAccessor.java:103)",
        *frames,
        "Caused by: org.springframework.dao.DataAccessResourceFailureException: Unable to "
        "acquire JDBC Connection",
        "\tat org.springframework.orm.jpa.vendor.HibernateJpaDialect.convert("
        "HibernateJpaDialect.java:277)",
        "\tat com.acme.orders.OrderRepository.load(OrderRepository.java:57)",
        "\t... 52 more",
        "Caused by: java.net.ConnectException: Connection refused",
        "\tat java.base/sun.nio.ch.Net.connect0(Native Method)",
        "\tat java.base/sun.nio.ch.Net.connect(Net.java:579)",
        "\tat org.postgresql.core.PGStream.createSocket(PGStream.java:243)",
        "\t... 61 more",
    ]
    return "\n".join(_entries(rng, entries // 2) + trace + _entries(rng, entries // 2, 60))


def node_log(seed: int, *, entries: int = 150) -> str:
    rng = random.Random(seed)
    trace = [
        "/app/src/routes/cart.js:57",
        "    const total = cart.items.reduce(sum, 0);",
        "                             ^",
        "",
        "TypeError: Cannot read properties of undefined (reading 'reduce')",
        "    at cartTotal (/app/src/routes/cart.js:57:30)",
        "    at Layer.handle [as handle_request] "
        "(/app/node_modules/express/lib/router/layer.js:95:5)",
        "    at next (/app/node_modules/express/lib/router/route.js:149:13)",
        "    at Route.dispatch (/app/node_modules/express/lib/router/route.js:119:3)",
        "    at /app/node_modules/express/lib/router/index.js:284:15",
        "    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)",
        "",
        "Node.js v20.11.1",
    ]
    return "\n".join(_entries(rng, entries) + trace)


def go_dump(seed: int, *, goroutines: int = 40) -> str:
    """A Go panic with every goroutine's stack, as a crashed server prints it."""
    rng = random.Random(seed)
    out = [
        "panic: assignment to entry in nil map",
        "",
        "goroutine 118 [running]:",
        "example.com/shop/cart.(*Store).Put(0xc0001a2000, {0xc00012c0f0, 0x8}, 0x3)",
        "\t/src/shop/cart/store.go:64 +0x1a5",
        "example.com/shop/cart.(*Handler).Add(0xc000124a80, {0x8a3e20, 0xc0001b60e0}, "
        "0xc0001c4000)",
        "\t/src/shop/cart/handler.go:37 +0x2f9",
        "net/http.HandlerFunc.ServeHTTP(0xc000208000?, {0x8a3e20?, 0xc0001b60e0?}, 0x0?)",
        "\t/usr/local/go/src/net/http/server.go:2166 +0x29",
        "net/http.serverHandler.ServeHTTP({0xc0001ae060?}, {0x8a3e20?, 0xc0001b60e0?}, 0x6?)",
        "\t/usr/local/go/src/net/http/server.go:3137 +0x8e",
        "created by net/http.(*Server).Serve in goroutine 1",
        "\t/usr/local/go/src/net/http/server.go:3285 +0x4b4",
    ]
    for g in range(goroutines):
        state = rng.choice(("IO wait", "select", "chan receive", "semacquire"))
        out += [
            "",
            f"goroutine {g + 1} [{state}, {rng.randint(1, 30)} minutes]:",
            "internal/poll.runtime_pollWait(0x7f2b4c1e8e88, 0x72)",
            "\t/usr/local/go/src/runtime/netpoll.go:345 +0x85",
            "internal/poll.(*pollDesc).wait(0xc000126080?, 0x4?, 0x0)",
            "\t/usr/local/go/src/internal/poll/fd_poll_runtime.go:84 +0x27",
            "net.(*conn).Read(0xc00011e028, {0xc000160000?, 0x0?, 0x0?})",
            "\t/usr/local/go/src/net/net.go:179 +0x45",
            f"created by net/http.(*Server).Serve in goroutine {rng.randint(1, 9)}",
            "\t/usr/local/go/src/net/http/server.go:3285 +0x4b4",
        ]
    out.append("exit status 2")
    return "\n".join(out)


def repeated_python(seed: int, *, times: int = 12) -> str:
    """The same traceback logged again and again, and one other once."""
    rng = random.Random(seed)
    same = [
        "Traceback (most recent call last):",
        '  File "/app/sync/pull.py", line 30, in pull',
        "    rows = client.fetch(cursor)",
        '  File "/app/.venv/lib/python3.11/site-packages/httpx/_client.py", line 1041, in send',
        "    raise exc",
        "httpx.ReadTimeout: timed out",
    ]
    other = [
        "Traceback (most recent call last):",
        '  File "/app/sync/store.py", line 12, in save',
        "    db.insert(rows)",
        "sqlite3.OperationalError: database is locked",
    ]
    out = []
    for k in range(times):
        out += _entries(rng, 10, k * 10)
        out.append(f"2026-03-04 10:0{k % 10}:00,000 ERROR [sync] pull failed (attempt {k + 1})")
        out += other if k == times // 2 else same
    return "\n".join(out)
