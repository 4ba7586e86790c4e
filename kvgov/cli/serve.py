"""``kvgov serve``: the bundled engine as a governed, OpenAI-compatible HTTP server.

    kvgov serve [--model PRESET|PATH] [--host 127.0.0.1] [--port 8000]
                [--api-key KEY ...] [--api-key-file PATH] [--admin-api-key KEY ...]
                [--num-blocks N | --kv-budget SIZE] [--swap-space SIZE] [--device auto]
                [--quantize int4|int8]
                [--served-model-name NAME] [--max-body-bytes N] [--max-waiting N]
                [--allowed-host NAME ...] [--max-head-bytes N] [--head-timeout S]
                [--body-timeout S] [--max-connections N] [--tenant-pin-share F]
                [--tenant-max-priority N] [--tenant-max-order-age S]

Also ``python -m kvgov.serve`` with the same options. Keys may also come from the
environment (``KVGOV_API_KEY``, or ``KVGOV_API_KEYS`` comma-separated). The command
prints where it listens, the model, the KV capacity (blocks, tokens, bytes), the host
swap space for offloaded KV (blocks, tokens, bytes, and whether ``--swap-space`` set it
or it was sized from the model: ``engine.host_swap``) and the security settings (how many
keys, never the keys; a warning when it listens beyond loopback without one) and its
limits, serves until interrupted, then closes the engine.
``kvgov.serve.settings`` says what each limit bounds.

Kept outside ``kvgov.serve`` so that ``kvgov --version`` imports neither FastAPI nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kvgov.cli.output import fail

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from engine.host_swap import HostSwap
    from governor.backend import BackendCapacity
    from kvgov.serve.settings import ServeSettings

__all__ = ["serve", "startup_lines", "uvicorn_config"]

_MIB = 1024 * 1024


def serve(
    model: Annotated[
        str, typer.Option(help="tiny-random, or a local Hugging Face checkpoint folder.")
    ] = "tiny-random",
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    api_key: Annotated[
        list[str] | None,
        typer.Option(help="A key clients send as 'Authorization: Bearer KEY'; repeatable."),
    ] = None,
    api_key_file: Annotated[
        str | None, typer.Option(help="A file with one API key per line (# comments).")
    ] = None,
    admin_api_key: Annotated[
        list[str] | None,
        typer.Option(
            help="An API key that may also pin prefixes shared by every tenant; repeatable."
        ),
    ] = None,
    num_blocks: Annotated[
        int | None, typer.Option(help="KV blocks to allocate (or use --kv-budget).")
    ] = None,
    kv_budget: Annotated[
        str | None, typer.Option(help="KV cache size: 256MiB, 2GB, 1.5GiB.")
    ] = None,
    swap_space: Annotated[
        str | None,
        typer.Option(
            help="Host memory for offloaded KV: 4GiB, 512MiB (default: sized from the model)."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    quantize: Annotated[
        str | None,
        typer.Option(help="int8 or int4: weight-only, quantized as the model loads."),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model name clients send (default: the model's).")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Larger request bodies get 413.")] = 4 * _MIB,
    max_waiting: Annotated[
        int, typer.Option(help="Model calls get 429 while this many wait for the engine.")
    ] = 256,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="Without API keys, another name clients may send in Host."),
    ] = None,
    max_head_bytes: Annotated[
        int, typer.Option(help="Larger request heads (line and headers) get 431.")
    ] = 64 * 1024,
    head_timeout: Annotated[
        float, typer.Option(help="Seconds a request's head may take to arrive (then 408).")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request's body may take after its head (408).")
    ] = 60.0,
    max_connections: Annotated[
        int, typer.Option(help="Requests get 503 while this many connections are open.")
    ] = 1024,
    tenant_pin_share: Annotated[
        float,
        typer.Option(help="With API keys: the pool's share that non-admin keys' pins split."),
    ] = 0.5,
    tenant_max_priority: Annotated[
        int, typer.Option(help="With API keys: the highest priority a non-admin key's call gets.")
    ] = 0,
    tenant_max_order_age: Annotated[
        float,
        typer.Option(help="With API keys: the most order_age_s a non-admin key's call gets."),
    ] = 60.0,
) -> None:
    """Serve the bundled engine over HTTP: OpenAI's API plus kvgov's control plane."""
    from kvgov.cli.extras import missing_for

    if (missing := missing_for("serve")) is not None:
        fail(missing)
    import uvicorn

    from backends.local.backend import LocalBackend
    from governor.errors import GovernorError
    from kvgov.demo import parse_size
    from kvgov.serve import ServeSettings
    from kvgov.serve.loading import LoadingApp
    from kvgov.serve.security import load_api_keys

    if num_blocks is not None and kv_budget is not None:
        fail("pass --num-blocks or --kv-budget, not both")
    if quantize not in (None, "int8", "int4"):
        fail(
            f"--quantize takes int8 or int4 (or leave it out for full precision), not {quantize!r}"
        )
    try:
        admin_keys = load_api_keys(admin_api_key or (), environ={})
        keys = load_api_keys([*(api_key or ()), *admin_keys], key_file=api_key_file)
        settings = ServeSettings(
            host=host,
            port=port,
            api_keys=keys,
            admin_api_keys=admin_keys,
            served_model_name=served_model_name,
            max_body_bytes=max_body_bytes,
            max_waiting_requests=max_waiting,
            allowed_hosts=tuple(allowed_host or ()),
            max_head_bytes=max_head_bytes,
            head_timeout_s=head_timeout,
            body_timeout_s=body_timeout,
            max_connections=max_connections,
            tenant_pin_share=tenant_pin_share,
            tenant_max_priority=tenant_max_priority,
            tenant_max_order_age_s=tenant_max_order_age,
        )
        config: dict[str, object] = {"model": model, "device": device, "quantize": quantize}
        if num_blocks is not None:
            config["num_blocks"] = num_blocks
        if kv_budget is not None:
            config["kv_cache_bytes"] = parse_size(kv_budget)
        if swap_space is not None:
            config["swap_space_bytes"] = parse_size(swap_space)
    except (GovernorError, ValueError) as exc:
        fail(str(exc))
    failures: list[BaseException] = []
    servers: list[uvicorn.Server] = []  # the loader's callbacks run once the server exists

    def ready(backend: LocalBackend) -> None:
        lines = engine_lines(
            settings, backend.model, backend.capacity(), quantize, host_swap=backend.host_swap
        )
        for line in lines:
            typer.echo(line)
        typer.echo("ready")

    def failed(error: BaseException) -> None:
        failures.append(error)
        typer.echo(f"Error: {error}", err=True)
        for running in servers:
            running.should_exit = True

    loading = LoadingApp(
        settings, lambda: LocalBackend(config=config), on_ready=ready, on_failed=failed
    )
    server = uvicorn.Server(uvicorn_config(loading, host=host, port=port, settings=settings))
    servers.append(server)
    for line in startup_lines(settings, model, None):
        typer.echo(line, err=line.startswith("WARNING"))
    typer.echo(f"loading {model}: /health answers 503 until it is ready")
    loading.start()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down, as uvicorn.run
        pass
    finally:
        loading.close()
    if failures:
        raise typer.Exit(code=2)


def uvicorn_config(
    app: ASGIApp, *, host: str, port: int, settings: ServeSettings | None = None
) -> uvicorn.Config:
    """How ``kvgov serve`` runs uvicorn; ``kvgov bench serve`` serves its engine the same
    way, so its figures are this server's. ``settings`` gives the connection limits
    (``ServeSettings``' defaults without it)."""
    import copy
    import functools

    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from kvgov.serve.connection import ConnectionLimits, LimitedHttpProtocol
    from kvgov.serve.gateway import ACCESS_LOGGER
    from kvgov.serve.settings import ServeSettings

    settings = settings or ServeSettings()
    limits = ConnectionLimits(
        max_head_bytes=settings.max_head_bytes,
        head_timeout_s=settings.head_timeout_s,
        body_timeout_s=settings.body_timeout_s,
    )

    # The access lines are the gateway's, written once the answer is sent, through
    # uvicorn's own handler and format (kvgov.serve.gateway says why).
    log_config = copy.deepcopy(LOGGING_CONFIG)
    log_config["loggers"][ACCESS_LOGGER] = {
        "handlers": ["access"],
        "level": "INFO",
        "propagate": False,
    }
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        log_config=log_config,
        access_log=False,
        timeout_graceful_shutdown=5,
        # uvicorn makes each connection's protocol by calling this, as it would the class.
        http=functools.partial(LimitedHttpProtocol, limits=limits),  # type: ignore[arg-type]  # see above
        limit_concurrency=settings.max_connections,
    )


def startup_lines(
    settings: ServeSettings,
    model: str,
    cap: BackendCapacity | None,
    *,
    host_swap: HostSwap | None = None,
) -> list[str]:
    """What ``kvgov serve`` prints: the address, the model, its KV capacity and host swap
    (once it is loaded: ``cap``, ``host_swap``), and the security settings and limits."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    lines = [
        f"kvgov serve: http://{host}:{settings.port}  (OpenAI API under /v1, control plane "
        "under /kvgov/v1, /metrics, /health)",
    ]
    if cap is not None:
        lines += engine_lines(settings, model, cap, host_swap=host_swap)
    keys = len(settings.api_keys)
    if keys:
        lines.append(
            f"security: {keys} API key(s), each its own tenant and cache salt; every route "
            "but /health needs 'Authorization: Bearer KEY'; "
            f"{len(settings.admin_api_keys)} may pin prefixes shared by every tenant"
        )
    else:
        lines.append("security: no API key; every client is let in")
    lines.append(
        f"limits: bodies up to {settings.max_body_bytes:,} bytes, heads up to "
        f"{settings.max_head_bytes:,} bytes; a head within {settings.head_timeout_s:g} s, a "
        f"body within {settings.body_timeout_s:g} s; 503 past {settings.max_connections:,} "
        f"connections; 429 while {settings.max_waiting_requests} requests wait"
    )
    if keys:
        lines.append(
            f"tenants: each non-admin key's pins hold at most {settings.tenant_pin_share:g} of "
            "the KV pool split between those keys; a fair share of the queue when it is "
            f"full; priority up to {settings.tenant_max_priority}, order_age_s up to "
            f"{settings.tenant_max_order_age_s:g} s"
        )
    elif not settings.allowed_hosts:
        lines.append(
            "browsers: Host must name this server (an IP address, localhost or --host); "
            "cross-site requests get 403"
        )
    else:
        lines.append(
            "browsers: Host must name this server (an IP address, localhost, --host or "
            f"{', '.join(settings.allowed_hosts)}); cross-site requests get 403"
        )
    if not keys and not settings.is_loopback:
        lines.append(
            f"WARNING: listening on {settings.host} without an API key: anyone who can reach "
            "this address can use the engine; pass --api-key or listen on 127.0.0.1"
        )
    return lines


def engine_lines(
    settings: ServeSettings,
    model: str,
    cap: BackendCapacity,
    quantize: str | None = None,
    *,
    host_swap: HostSwap | None = None,
) -> list[str]:
    """The model, its weights, its KV capacity and its host swap (``host_swap``, where
    known), printed once the engine is loaded."""
    tokens = cap.num_blocks * cap.block_size
    size = cap.num_blocks * cap.bytes_per_block
    name = settings.served_model_name or model
    lines = [
        f"model: {name}"
        + ("" if name == model else f" (serving {model})")
        + f", context {cap.max_model_len:,} tokens",
        f"KV cache: {cap.num_blocks:,} blocks of {cap.block_size} tokens = {tokens:,} tokens, "
        f"{size / _MIB:,.1f} MiB ({cap.bytes_per_block:,} bytes per block)",
    ]
    if cap.weights_bytes:
        lines.append(
            f"weights: {cap.weights_bytes / _MIB:,.1f} MiB "
            + (f"({quantize} weight-only, group-wise scales)" if quantize else "(full precision)")
        )
    if host_swap is not None:
        lines.append(host_swap_line(host_swap))
    return lines


def host_swap_line(swap: HostSwap) -> str:
    """How much host memory holds offloaded KV, in blocks and tokens, and why that much:
    the serve option that set it, or the engine's rule from the model."""
    import dataclasses

    from engine.host_swap import SwapSizing

    if swap.sizing is SwapSizing.BYTES:  # the only setting kvgov serve passes
        swap = dataclasses.replace(swap, reason="set by --swap-space")
    return swap.describe()
