"""Source code as the generators need it: repository paths and plausible lines per language.

The lines are not programs; they read like the statements of a service's code base
(assignments, calls, guards, returns, imports) so that diffs, grep hits and code frames
look like the real thing.
"""

from __future__ import annotations

import random

from policies.benchmarks.tool_outputs._common import NOUNS, SERVICES, VERBS, camel, pascal

LANGUAGES = ("python", "go", "typescript", "yaml")
_MODULES = (
    "client",
    "models",
    "views",
    "tasks",
    "config",
    "settings",
    "utils",
    "handlers",
    "store",
    "schemas",
    "service",
    "api",
    "retry",
    "cache",
    "events",
)
_EXTENSIONS = {
    "python": ".py",
    "go": ".go",
    "typescript": ".ts",
    "yaml": ".yaml",
    "rust": ".rs",
    "java": ".java",
}
_ATTRS = ("id", "status", "total", "created_at", "owner", "items", "currency", "version", "tags")
_ERRORS = ("NotFound", "Validation", "Conflict", "Timeout", "Permission")


def source_path(rng: random.Random, language: str, service: str | None = None) -> str:
    svc = service or rng.choice(SERVICES)
    mod = rng.choice(_MODULES + NOUNS[:8])
    if language == "python":
        return rng.choice(
            (
                f"src/{svc}/{mod}.py",
                f"src/{svc}/{rng.choice(_MODULES)}/{mod}.py",
                f"tests/{svc}/test_{mod}.py",
            )
        )
    if language == "go":
        return rng.choice(
            (f"internal/{svc}/{mod}.go", f"pkg/{svc}/{mod}.go", f"internal/{svc}/{mod}_test.go")
        )
    if language == "typescript":
        return rng.choice(
            (f"src/{svc}/{mod}.ts", f"src/components/{pascal(svc, mod)}.tsx", f"src/api/{svc}.ts")
        )
    if language == "yaml":
        return rng.choice(
            (
                f"deploy/{svc}/values-{rng.choice(('prod', 'staging', 'eu'))}.yaml",
                f"config/{svc}.yaml",
                f".github/workflows/{svc}.yml",
            )
        )
    if language == "rust":
        return rng.choice((f"src/{mod}.rs", f"src/{svc}/{mod}.rs", f"crates/{svc}/src/{mod}.rs"))
    role = rng.choice(("Service", "Controller", ""))
    return f"src/main/java/com/acme/{svc}/{pascal(mod)}{role}.java"


def language_of(path: str) -> str:
    for language, extension in _EXTENSIONS.items():
        if path.endswith(extension) or (extension == ".ts" and path.endswith(".tsx")):
            return language
    return "yaml"


def code_line(rng: random.Random, language: str) -> str:
    """One line of plausible code, indented as it would sit inside a function body."""
    verb, noun, other = rng.choice(VERBS), rng.choice(NOUNS), rng.choice(NOUNS)
    attr = rng.choice(_ATTRS)
    if language == "python":
        return rng.choice(
            (
                f"    {noun} = {verb}_{noun}({other}.{attr})",
                f"    if {noun}.{attr} is None:",
                f"        return {noun}",
                f'    logger.info("{noun} %s {verb}d", {noun}.id)',
                f"def {verb}_{noun}({other}: {pascal(other)}) -> {pascal(noun)}:",
                f"from {rng.choice(SERVICES)}.{rng.choice(_MODULES)} import {pascal(noun)}",
                f"    for {noun} in {other}.{noun}s:",
                f"        {noun}.{attr} = {other}.{attr}",
                f"        raise {rng.choice(_ERRORS)}Error("
                f'f"{noun} {{{noun}.id}} cannot be {verb}d")',
                "",
                f"    {attr}: {rng.choice(('str', 'int', 'bool', 'datetime'))} | None = None",
                f"    await self.{noun}s.{verb}({other}_id)",
            )
        )
    if language == "go":
        return rng.choice(
            (
                f"func (s *{pascal(noun)}Service) {pascal(verb, other)}(ctx context.Context, id "
                f"string) (*{pascal(other)}, error) {{",
                "\tif err != nil {",
                f'\t\treturn nil, fmt.Errorf("{verb} {noun}: %w", err)',
                "\t}",
                f"\t{camel(noun)}, err := s.{camel(other, 'store')}.Get(ctx, id)",
                f"\t{camel(noun)}.{pascal(attr)} = {camel(other)}.{pascal(attr)}",
                "}",
                "",
                f'\ts.log.Info("{noun} {verb}d", "id", {camel(noun)}.ID)',
                f"\tfor _, {camel(noun)} := range {camel(other)}.{pascal(noun)}s {{",
            )
        )
    if language == "typescript":
        return rng.choice(
            (
                f"export async function {camel(verb, noun)}(id: string): "
                f"Promise<{pascal(noun)}> {{",
                f"  const {camel(noun)} = await api.get(`/{noun}s/${{id}}`);",
                f"  if (!{camel(noun)}) throw new Error('{noun} not found');",
                f"  return {camel(noun)};",
                "}",
                "",
                f"import {{ {pascal(noun)} }} from './{rng.choice(_MODULES)}';",
                f"  {camel(noun)}.{camel(attr)} = {camel(other)}.{camel(attr)};",
                f"  logger.debug('{verb} {noun}', {{ id: {camel(noun)}.id }});",
            )
        )
    return rng.choice(
        (
            f"  {noun}_{attr}: {rng.choice(('true', 'false', rng.randint(1, 64), 'auto'))}",
            f"{noun}s:",
            f"  - name: {verb}-{noun}",
            f"    image: ghcr.io/acme/{noun}:{rng.randint(1, 9)}.{rng.randint(0, 30)}.0",
            f"    replicas: {rng.randint(1, 12)}",
            "",
            f"  # {verb} {noun}s before {other}s",
        )
    )


# A setting a change or a search is about: what people call it, its name, a unit.
SETTINGS = (
    ("retry timeout", "retry_timeout", "s"),
    ("connection pool size", "pool_size", ""),
    ("maximum upload size", "max_upload_mb", ""),
    ("session lifetime", "session_ttl", "s"),
    ("rate limit", "rate_limit_per_min", ""),
    ("batch size", "batch_size", ""),
    ("cache expiry", "cache_ttl", "s"),
    ("worker concurrency", "worker_concurrency", ""),
    ("request timeout", "request_timeout", "ms"),
    ("maximum retries", "max_retries", ""),
    ("queue depth limit", "max_queue_depth", ""),
    ("health check interval", "healthcheck_interval", "s"),
)


def setting_name(name: str, unit: str, language: str) -> str:
    """How a setting is spelled in one language's code: RETRY_TIMEOUT_S, retryTimeout, ..."""
    full = f"{name}_{unit}" if unit else name
    if language in ("python", "typescript"):
        return full.upper()
    if language == "go":
        return camel(name)
    return full


def setting_line(name: str, unit: str, value: str, language: str) -> str:
    spelled = setting_name(name, unit, language)
    if language == "python":
        return f"{spelled} = {value}"
    if language == "go":
        suffix = {"s": " * time.Second", "ms": " * time.Millisecond"}.get(unit, "")
        return f"\t{spelled} = {value}{suffix}"
    if language == "typescript":
        return f"export const {spelled} = {value};"
    return f"  {spelled}: {value}"


def setting_usage(rng: random.Random, name: str, unit: str, language: str) -> str:
    """A line that uses the setting without giving its value."""
    spelled = setting_name(name, unit, language)
    if language == "python":
        return rng.choice(
            (
                f"    time.sleep({spelled})",
                f"        timeout={spelled},",
                f"    if attempts > {spelled}:",
                f"from .config import {spelled}",
            )
        )
    if language == "go":
        return rng.choice(
            (
                f"\tctx, cancel := context.WithTimeout(ctx, {spelled})",
                f"\tif n > {spelled} {{",
                f"\t\tLimit: {spelled},",
            )
        )
    if language == "typescript":
        return rng.choice(
            (
                f"  await sleep({spelled});",
                f"  if (attempt > {spelled}) break;",
                f"import {{ {spelled} }} from './config';",
            )
        )
    return f"  # {spelled} is read from the environment when set"
