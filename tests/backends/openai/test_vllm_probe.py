"""VLLMProbe against a FAKE vLLM server (tests/fake_engines.py: vLLM needs CUDA, so it
cannot run here) serving /metrics, /v1/models and /version as vLLM 0.33.0's source (and
v0.8's, for the old names) writes them. Figures are derived from the fixtures' numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from backends.http.probe import EngineProbe, EngineReading
from backends.http.prometheus_text import parse_exposition
from backends.openai._vllm_probe import VLLMProbe
from tests.fake_engines import ClientProbeHTTP, FakeEngine, create_app

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"


@pytest.fixture
def serve():
    clients = []

    def start(**options) -> tuple[FakeEngine, ClientProbeHTTP]:
        fake = FakeEngine("vllm", **options)
        client = TestClient(create_app(fake))
        clients.append(client)
        return fake, ClientProbeHTTP(client)

    yield start
    for client in clients:
        client.close()


def test_one_engine_capacity_and_pressure_as_the_fixture_says(serve):
    _, http = serve()
    reading = VLLMProbe().read(http)
    assert isinstance(VLLMProbe(), EngineProbe)
    assert (reading.block_size, reading.num_blocks, reading.kv_tokens) == (16, 27910, 446560)
    assert reading.num_tokens == 27910 * 16
    assert reading.max_model_len == 32768
    assert reading.kv_usage == 0.25
    assert (reading.num_requests_running, reading.num_requests_waiting) == (3, 1)
    assert reading.num_preemptions == 2
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (4000, 1500)
    assert reading.instance == "vllm 0.33.0 started 1796138400.25"
    assert reading.missing == ()


def test_data_parallel_ranks_are_added_up_and_usage_weighted_by_capacity(serve):
    _, http = serve(fixtures="dp2")
    reading = VLLMProbe().read(http)
    assert reading.num_blocks == 2 * 27910 and reading.kv_tokens == 2 * 446560
    assert reading.kv_usage == (0.25 + 0.75) / 2  # equal ranks: the plain mean
    assert (reading.num_requests_running, reading.num_requests_waiting) == (3 + 5, 1 + 0)
    assert reading.num_preemptions == 2 + 7
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (10000, 2000)
    assert set(reading.raw["ranks"]) == {"0", "1"}
    assert reading.raw["ranks"]["1"]["kv_usage"] == 0.75
    # multiprocess mode has no process start: said once, restart then seen by counters
    assert reading.instance == "vllm 0.33.0 started None"
    assert len(reading.missing) == 1 and "process_start_time_seconds" in reading.missing[0]


def test_v0_8_names_without_engine_label_or_kv_cache_size_tokens(serve):
    _, http = serve(fixtures="v0_8")
    reading = VLLMProbe().read(http)
    assert reading.kv_usage == 0.25  # vllm:gpu_cache_usage_perc
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (4000, 1500)
    assert reading.kv_tokens is None and reading.num_tokens == 27910 * 16
    assert reading.instance == "vllm None started 1796138400.25"  # no /version route read


def test_kv_cache_size_tokens_wins_over_blocks_times_block_size():
    # A hybrid model: a request holds blocks in several KV groups, so vLLM says the
    # token capacity outright and blocks x block size would overstate it.
    text = (
        'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="223280",'
        'num_gpu_blocks="27910"} 1.0\n'
    )

    class HTTP:
        def get_text(self, path):
            return text if path == "/metrics" else None

        def get_json(self, path):
            return None

    reading = VLLMProbe().read(HTTP())
    assert reading.num_tokens == 223280 and reading.num_blocks * reading.block_size == 446560


@pytest.mark.parametrize(
    ("gone", "fields"),
    [
        ("vllm:cache_config_info", ("num_blocks", "block_size", "kv_tokens")),
        ("vllm:kv_cache_usage_perc", ("kv_usage",)),
        ("vllm:num_preemptions", ("num_preemptions",)),
        ("vllm:prefix_cache_queries", ("prefix_cache_queries",)),
        ("/v1/models", ("max_model_len",)),
    ],
)
def test_a_missing_field_is_none_and_named_once_never_guessed(serve, gone, fields):
    _, http = serve(missing={gone})
    reading = VLLMProbe().read(http)
    full = VLLMProbe().read(serve()[1])
    for name in fields:
        assert getattr(reading, name) is None
    if gone == "vllm:cache_config_info":
        assert reading.num_tokens is None  # never a capacity made up
    assert len(reading.missing) == 1 and gone.lstrip("/").split("_total")[0] in reading.missing[0]
    untouched = set(EngineReading.__slots__) - set(fields) - {"missing", "raw"}
    if gone == "vllm:cache_config_info":
        untouched -= {"kv_usage"}  # still read, weighted as a plain mean
    for name in untouched:
        assert getattr(reading, name) == getattr(full, name), name


def test_no_metrics_route_reads_nothing_and_says_so(serve):
    _, http = serve(missing={"/metrics", "/version", "/v1/models"})
    reading = VLLMProbe().read(http)
    assert reading.num_tokens is None and reading.kv_usage is None and reading.instance is None
    assert any(m.startswith("/metrics (404)") for m in reading.missing)
    assert len(reading.missing) == len(set(reading.missing)) == 3


def test_a_restart_changes_the_instance_and_counters_go_down(serve):
    fake, http = serve()
    before = VLLMProbe().read(http)
    fake.restart()
    after = VLLMProbe().read(http)
    assert after.instance != before.instance
    assert after.num_preemptions == 0 < before.num_preemptions
    assert after.prefix_cache_queries == 0 < before.prefix_cache_queries
    assert after.num_tokens == before.num_tokens  # the capacity is the same engine's


def test_the_fixture_names_are_the_names_vllm_defines():
    # Names quoted from vllm/v1/metrics/loggers.py (0.33.0); prometheus_client appends
    # _total to a counter's samples.
    names = {s.name for s in parse_exposition((FIXTURE_DIR / "metrics.txt").read_text()).samples}
    assert {
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    } <= names


def test_priority_is_sent_negated_and_only_where_the_server_schedules_by_it(serve, monkeypatch):
    _, http = serve()
    unknown = VLLMProbe().priority_rule(http)  # /server_info is dev mode only
    assert not unknown.enabled and unknown.value(5) is None
    assert "priority_scheduling=True" in unknown.reason
    declared = VLLMProbe(priority_scheduling=True).priority_rule(http)
    assert [declared.value(p) for p in (3, 0, -2)] == [-3, 0, 2]  # vLLM: lower runs first
    assert VLLMProbe(priority_scheduling=False).priority_rule(http).value(3) is None

    class DevMode:
        def get_text(self, path):
            return None

        def get_json(self, path):
            assert path == "/server_info?config_format=json"
            return json.loads((FIXTURE_DIR / "server_info_dev.json").read_text())

    rule = VLLMProbe().priority_rule(DevMode())
    assert rule.enabled and rule.value(4) == -4
