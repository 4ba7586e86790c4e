"""``kvgov plan``: size a KV budget with the capacity calculator (contiguous reserve at
the ceiling, at a lower cap, or paged), or with ``--simulate`` run the agents on the
hardware twin of a card (``kvgov.cli.simulate``). A combination of options that cannot
go together ends the command with one line naming them.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from kvgov.cli.calculator import plan_from_options
from kvgov.cli.output import fail
from kvgov.cli.simulate import plan_simulate
from kvgov.tables import print_table

__all__ = ["plan"]


def plan(
    ctx: typer.Context,
    preset: Annotated[
        str | None, typer.Option(help="A named model: qwen3.5-9b, or a bundled preset.")
    ] = None,
    config: Annotated[
        str | None, typer.Option(help="A Hugging Face config.json, or the folder holding it.")
    ] = None,
    card_gb: Annotated[float, typer.Option(help="The card's memory, GB.")] = 16.0,
    weights_gb: Annotated[
        float | None,
        typer.Option(help="Memory the weights take, GB [default: 5.5, or counted: --quantize]."),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(help="int8 or int4: count the weights from --config, quantized."),
    ] = None,
    overhead_gb: Annotated[
        float, typer.Option(help="Activations, runtime and fragmentation, GB.")
    ] = 0.5,
    kv_dtype: Annotated[
        str | None, typer.Option(help="KV cache dtype: fp16, bf16, fp8 or fp32.")
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    ceiling: Annotated[int, typer.Option(help="Each agent's ceiling, tokens.")] = 16_000,
    cap: Annotated[
        int | None, typer.Option(help="The lower contiguous cap, tokens (half the ceiling).")
    ] = None,
    agents: Annotated[int, typer.Option(help="How many agents run at once.")] = 8,
    average: Annotated[int, typer.Option(help="Their average context, tokens.")] = 3_000,
    safety: Annotated[float, typer.Option(help="Admission's safety factor, (0, 1].")] = 0.9,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per row, nothing else.")
    ] = False,
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Run the agents on the hardware twin of --device with --model: "
            "reserve-for-max, the paged engine alone and kvgov, in virtual time.",
        ),
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(help="--simulate: a device profile (rx9070xt, h100-sxm, ...) or file."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="--simulate: qwen3-8b, an engine preset, or a config.json."),
    ] = None,
    host_gb: Annotated[
        float, typer.Option(help="--simulate: host memory for offloaded KV, GiB.")
    ] = 16.0,
    turns: Annotated[int, typer.Option(help="--simulate: tool calls each worker makes.")] = 8,
    reply_tokens: Annotated[
        int, typer.Option(help="--simulate: tokens each model call generates.")
    ] = 256,
    tool_scale: Annotated[
        float,
        typer.Option(help="--simulate: x the swarm benchmark's tool latencies (20: 3-10 s)."),
    ] = 20.0,
    seed: Annotated[int, typer.Option(help="--simulate: the workload's seed.")] = 1,
    trace: Annotated[
        str | None,
        typer.Option(
            help="--simulate: replay a recorded run (a `kvgov report` trace) instead of the "
            "swarm; --agents N then repeats its runs to N agents."
        ),
    ] = None,
) -> None:
    """Size a KV budget: contiguous reserve at the ceiling, at a lower cap, or paged; with
    --simulate, run the agents on the hardware twin of a card and compare the schemes."""
    from governor.plan import plan_rows, render_plan

    def given(name: str) -> bool:
        # By name: typer carries its own copy of click, and so of ParameterSource.
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    if trace is not None and not simulate:
        fail("--trace is replayed on the hardware twin: add --simulate with --device and --model")
    if simulate:
        if preset is not None or config is not None or weights_gb is not None:
            fail(
                "with --simulate, name the model with --model (its weights are counted) "
                "and the card with --device; --preset, --config and --weights-gb are the "
                "calculator's"
            )
        swarm_only = ["turns", "reply_tokens", "tool_scale", "seed", "ceiling"]
        if trace is not None and (shaped := [name for name in swarm_only if given(name)]):
            options = ", ".join("--" + name.replace("_", "-") for name in shaped)
            fail(
                f"{options} shape the swarm workload; a trace is replayed as recorded (its "
                "calls, contexts and tool times): leave them out, or leave out --trace"
            )
        plan_simulate(
            device=device,
            model=model,
            quantize=quantize,
            agents=agents,
            ceiling=ceiling,
            overhead_gb=overhead_gb,
            host_gb=host_gb,
            turns=turns,
            reply_tokens=reply_tokens,
            tool_scale=tool_scale,
            block_size=block_size,
            seed=seed,
            json_lines=json_lines,
            trace=trace,
            trace_agents=agents if given("agents") else None,
        )
        return
    if quantize is not None:
        weights_gb = _quantized_weights_gb(config, quantize, weights_gb)
    made = plan_from_options(
        preset=preset,
        config=config,
        card_gb=card_gb,
        weights_gb=5.5 if weights_gb is None else weights_gb,
        overhead_gb=overhead_gb,
        kv_dtype=kv_dtype,
        block_size=block_size,
        ceiling=ceiling,
        cap=cap,
        agents=agents,
        average=average,
        safety=safety,
    )
    if json_lines:
        for row in plan_rows(made):
            typer.echo(json.dumps(row))
        return
    headline, table = render_plan(made)
    console = Console()
    console.print(headline)
    print_table(console, table)


def _quantized_weights_gb(config: str | None, quantize: str, weights_gb: float | None) -> float:
    from governor.errors import GovernorError
    from governor.weights_size import weights_bytes_from_hf_config

    if config is None or weights_gb is not None:
        fail(
            "--quantize counts the weights from a config.json: pass --config PATH with it "
            "and leave out --weights-gb (or give --weights-gb alone)"
        )
    try:
        return weights_bytes_from_hf_config(config, quantize=quantize) / 1e9
    except GovernorError as exc:
        fail(str(exc))
