"""The names kvgov's telemetry is written with and read back by: one place for both sides.

``integrations.otel`` writes spans, span events and metrics with these names;
``integrations.report`` and ``kvgov plan --trace`` read them back from a JSON-lines file,
so a name changed here changes the recorded format. GenAI names follow the
OpenTelemetry semantic conventions (CONTRIBUTING.md, "Observability names"); ``kvgov.*``
names are our own, for memory.
"""

from __future__ import annotations

__all__ = [
    "ADMISSION_MODE",
    "AGENT_NAME",
    "BLOCKS",
    "BLOCKS_HELD",
    "BLOCK_SIZE",
    "BYTES_PER_BLOCK",
    "CACHED_TOKENS",
    "CACHE_READ_TOKENS",
    "CEILING",
    "COMPACTIONS",
    "COMPACTION_SAVED",
    "DETAIL",
    "ELAPSED_S",
    "ENDED_BY",
    "ERROR_TYPE",
    "EVENT_ADMITTED",
    "EVENT_CALL",
    "EVENT_COMPACTED",
    "EVENT_DROPPED",
    "EVENT_OFFLOADED",
    "EVENT_PARKED",
    "EVENT_PREEMPTED",
    "EVENT_RESTORED",
    "EVENT_RESUMED",
    "EVENT_RETAINED",
    "EVENT_SUMMARIZED",
    "FINISH_REASON",
    "FINISH_REASONS",
    "INPUT_TOKENS",
    "LEASE_ID",
    "METHOD",
    "METRIC_ADMISSION_WAIT",
    "METRIC_BLOCKS_FREE",
    "METRIC_BLOCKS_IN_USE",
    "METRIC_LEASE_ACTIVE",
    "METRIC_PREEMPTIONS",
    "METRIC_SEQ_TOKENS",
    "METRIC_TOKEN_USAGE",
    "NUM_ADMISSIONS",
    "NUM_AVAILABLE_BLOCKS",
    "NUM_BLOCKS",
    "NUM_CALLS",
    "OFFLOADED",
    "OFFLOADED_BLOCKS",
    "OPERATION",
    "OUTPUT_TOKENS",
    "PARENT_LEASE_ID",
    "PARKED",
    "PREEMPTIONS",
    "PREFIX_BLOCKS",
    "PRESSURE_IN_USE",
    "PRESSURE_NEEDED",
    "PRESSURE_NUM_BLOCKS",
    "PRIORITY",
    "PROVIDER",
    "REASON",
    "REQUEST_MAX_TOKENS",
    "REQUEST_MODEL",
    "RUN_ID",
    "RUN_PARENT_ID",
    "SAFETY_FACTOR",
    "SEQ_TOKENS",
    "SUMMARIZATIONS",
    "SUMMARIZE_SAVED",
    "TENANT",
    "TOKENS",
    "TOKENS_AFTER",
    "TOKENS_BEFORE",
    "TOKENS_SAVED",
    "TOKEN_TYPE",
    "TOOL_NAME",
    "TOOL_OUTPUT_TOKENS",
    "WAIT_S",
    "WORKFLOW_NAME",
]

# -- OpenTelemetry GenAI semantic conventions ------------------------------------------
OPERATION = "gen_ai.operation.name"  # "invoke_workflow", "invoke_agent", "chat", "execute_tool"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
AGENT_NAME = "gen_ai.agent.name"
WORKFLOW_NAME = "gen_ai.workflow.name"
TOOL_NAME = "gen_ai.tool.name"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"

# -- kvgov: runs and the KV budget (on invoke_workflow spans) ---------------------------
RUN_ID = "kvgov.run.id"
RUN_PARENT_ID = "kvgov.run.parent_id"
NUM_BLOCKS = "kvgov.kv.num_blocks"
NUM_AVAILABLE_BLOCKS = "kvgov.kv.num_available_blocks"  # less the pinned shared prefixes
BLOCK_SIZE = "kvgov.kv.block_size"
BYTES_PER_BLOCK = "kvgov.kv.bytes_per_block"
SAFETY_FACTOR = "kvgov.admission.safety_factor"
ADMISSION_MODE = "kvgov.admission.mode"

# -- kvgov: leases (on invoke_agent spans; the last group is set when the span ends) ----
LEASE_ID = "kvgov.lease.id"
PARENT_LEASE_ID = "kvgov.lease.parent_id"
PRIORITY = "kvgov.lease.priority"
TENANT = "kvgov.tenant"
CEILING = "kvgov.lease.ceiling_tokens"
PREFIX_BLOCKS = "kvgov.lease.prefix_blocks"  # its shared prefix's pinned blocks, if any
TOOL_OUTPUT_TOKENS = "kvgov.agent.tool_output_tokens"
WAIT_S = "kvgov.admission.wait_s"  # summed over the admissions of the lease
NUM_ADMISSIONS = "kvgov.admission.count"
PARKED = "kvgov.lease.parked"  # times parked
OFFLOADED = "kvgov.kv.offloaded"  # times its held KV went to host memory
OFFLOADED_BLOCKS = "kvgov.kv.offloaded_blocks"
COMPACTIONS = "kvgov.compactions"
COMPACTION_SAVED = "kvgov.compaction.tokens_saved"
SUMMARIZATIONS = "kvgov.summarizations"
SUMMARIZE_SAVED = "kvgov.summarize.tokens_saved"
NUM_CALLS = "kvgov.lease.num_calls"
SEQ_TOKENS = "kvgov.seq.tokens"  # on an agent span: the most; on a chat span: that call's
ENDED_BY = "kvgov.span.ended_by"  # "uninstrument" or "run end" when no release ended it

# -- kvgov: model calls (on chat spans, or kvgov.call events with model_spans=False) ----
BLOCKS_HELD = "kvgov.kv.blocks_held"
CACHED_TOKENS = "kvgov.prefix.cached_tokens"
FINISH_REASON = "kvgov.finish_reason"
ELAPSED_S = "kvgov.elapsed_s"

# -- span events and their attributes ---------------------------------------------------
EVENT_ADMITTED = "kvgov.admitted"
EVENT_RESUMED = "kvgov.resumed"
EVENT_PARKED = "kvgov.parked"
EVENT_CALL = "kvgov.call"  # a model call, when model_spans=False
EVENT_COMPACTED = "kvgov.compacted"
EVENT_SUMMARIZED = "kvgov.summarized"
EVENT_RETAINED = "kvgov.retained"
EVENT_OFFLOADED = "kvgov.offloaded"
EVENT_DROPPED = "kvgov.dropped"
EVENT_RESTORED = "kvgov.restored"
EVENT_PREEMPTED = "kvgov.preempted"
REASON = "kvgov.reason"
METHOD = "kvgov.method"
DETAIL = "kvgov.detail"  # why a reduction took the method it did (a fallback's reason)
TOKENS_BEFORE = "kvgov.tokens_before"
TOKENS_AFTER = "kvgov.tokens_after"
TOKENS_SAVED = "kvgov.tokens_saved"
BLOCKS = "kvgov.kv.blocks"
TOKENS = "kvgov.tokens"
PREEMPTIONS = "kvgov.engine.preemptions"  # new preemptions seen when the call ended
PRESSURE_IN_USE = "kvgov.pressure.blocks_in_use"
PRESSURE_NUM_BLOCKS = "kvgov.pressure.num_blocks"
PRESSURE_NEEDED = "kvgov.pressure.blocks_needed"

# -- metrics --------------------------------------------------------------------------
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_BLOCKS_IN_USE = "kvgov.kv.blocks_in_use"
METRIC_BLOCKS_FREE = "kvgov.kv.blocks_free"
METRIC_SEQ_TOKENS = "kvgov.seq.tokens"
METRIC_ADMISSION_WAIT = "kvgov.admission.wait"
METRIC_LEASE_ACTIVE = "kvgov.lease.active"
METRIC_PREEMPTIONS = "kvgov.engine.preemptions"
