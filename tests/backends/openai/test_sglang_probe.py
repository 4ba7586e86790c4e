"""SGLangProbe against a FAKE SGLang server (tests/fake_engines.py: SGLang needs CUDA, so
it cannot run here) serving /server_info, /v1/loads, /v1/models and /metrics as SGLang
0.5.23's source writes them, and /get_server_info and /get_load as older versions did."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from backends.http.probe import EngineProbe
from backends.openai._sglang_probe import SGLangProbe
from tests.fake_engines import ClientProbeHTTP, FakeEngine, create_app


@pytest.fixture
def serve():
    clients = []

    def start(**options) -> tuple[FakeEngine, ClientProbeHTTP]:
        fake = FakeEngine("sglang", **options)
        client = TestClient(create_app(fake))
        clients.append(client)
        return fake, ClientProbeHTTP(client)

    yield start
    for client in clients:
        client.close()


def test_one_rank_capacity_and_pressure_as_the_fixtures_say(serve):
    _, http = serve()
    reading = SGLangProbe().read(http)
    assert isinstance(SGLangProbe(), EngineProbe)
    assert (reading.kv_tokens, reading.block_size, reading.num_blocks) == (327680, 1, 327680)
    assert reading.max_model_len == 40960
    assert reading.kv_usage == 0.125 and reading.num_tokens_in_use == 40960
    assert (reading.num_requests_running, reading.num_requests_waiting) == (4, 1)
    assert reading.num_preemptions == 1  # sglang:num_retracted_requests_total
    # prompt tokens (streaming and not) and cached tokens (device and host)
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (9000 + 1000, 3000 + 500)
    assert reading.instance is not None and reading.instance.startswith("sglang 0.5.23 ")
    assert reading.missing == ()


def test_two_data_parallel_ranks_are_added_up(serve):
    _, http = serve(fixtures="dp2")
    reading = SGLangProbe().read(http)
    # max_total_num_tokens is one rank's pool; pages of 16 tokens
    assert reading.kv_tokens == 2 * 327680 and reading.block_size == 16
    assert reading.num_blocks == 2 * 327680 // 16
    assert reading.kv_usage == (0.125 + 0.5) / 2
    assert reading.num_tokens_in_use == 40960 + 163840
    assert (reading.num_requests_running, reading.num_requests_waiting) == (4 + 2, 1 + 3)
    assert reading.num_preemptions == 1 + 2
    assert reading.max_model_len == 40960  # /v1/models, the served context
    assert set(reading.raw["ranks"]) == {"0", "1"}


def test_older_routes_get_server_info_and_get_load(serve):
    _, http = serve(fixtures="legacy")
    reading = SGLangProbe().read(http)
    assert reading.kv_tokens == 2 * 327680  # from the per-rank gauge in /metrics
    # /get_load: num_reqs is running plus waiting
    assert (reading.num_requests_running, reading.num_requests_waiting) == (4 + 2, 1 + 3)
    assert reading.missing == ()


def test_capacity_falls_back_to_server_info_times_dp_size(serve):
    _, http = serve(fixtures="dp2", missing={"/v1/loads", "sglang:max_total_num_tokens"})
    reading = SGLangProbe().read(http)
    assert reading.kv_tokens == 2 * 327680


@pytest.mark.parametrize(
    ("gone", "fields"),
    [
        ("/server_info", ("block_size", "num_blocks")),
        ("/metrics", ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits")),
        ("/v1/models", ("max_model_len",)),
    ],
)
def test_a_missing_route_leaves_its_fields_none_and_says_so(serve, gone, fields):
    _, http = serve(missing={gone})
    reading = SGLangProbe().read(http)
    for name in fields:
        assert getattr(reading, name) is None, name
    assert any(gone in m or gone.split("/")[-1] in m for m in reading.missing)
    assert reading.kv_tokens == 327680  # /v1/loads still says the pool


def test_nothing_exposed_is_no_capacity_not_a_crash(serve):
    _, http = serve(missing={"/server_info", "/v1/loads", "/metrics", "/v1/models"})
    reading = SGLangProbe().read(http)
    assert reading.num_tokens is None and reading.kv_usage is None and reading.instance is None
    assert len(reading.missing) == len(set(reading.missing))


def test_a_zero_pool_in_a_load_snapshot_not_yet_published_is_not_a_capacity():
    class HTTP:
        def get_text(self, path):
            return None

        def get_json(self, path):
            if path == "/v1/loads":
                return {"loads": [{"dp_rank": 0, "max_total_num_tokens": 0}]}
            return None

    assert SGLangProbe().read(HTTP()).num_tokens is None


def test_a_restart_changes_the_instance_and_counters_go_down(serve):
    fake, http = serve()
    before = SGLangProbe().read(http)
    fake.restart()
    after = SGLangProbe().read(http)
    assert after.instance != before.instance
    assert after.num_preemptions == 0 < before.num_preemptions
    assert after.prefix_cache_queries == 0 < before.prefix_cache_queries


def test_priority_polarity_follows_server_info(serve):
    _, off = serve()
    rule = SGLangProbe().priority_rule(off)
    assert not rule.enabled and rule.value(5) is None  # never sent to a FCFS server
    _, low_first = serve(fixtures="dp2")  # --schedule-low-priority-values-first
    rule = SGLangProbe().priority_rule(low_first)
    assert rule.enabled and rule.lower_first and rule.value(5) == -5


def test_priority_default_polarity_is_higher_first(serve):
    class Default:
        def get_text(self, path):
            return None

        def get_json(self, path):
            if path == "/server_info":
                return {"enable_priority_scheduling": True}
            return None

    rule = SGLangProbe().priority_rule(Default())
    assert rule.enabled and not rule.lower_first and rule.value(5) == 5
