"""What kvgov sends vLLM and SGLang: cache salts that vLLM's validator
(vllm/entrypoints/generate/base/protocol.py ``validate_cache_salt``, 0.33.0) accepts and
that keep tenants apart; priorities in each engine's polarity; vLLM's priority refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.openai._engine_requests import PriorityRule, engine_cache_salt, is_priority_rejection

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# vLLM 0.33.0's rules, restated: 1 to 128 characters, none of these
VLLM_FORBIDDEN = set("@/\\\x00")


@pytest.mark.parametrize("tenant", ["acme", "a/b@c\\d", "x" * 5000, "ünïcødé", ""])
def test_a_tenant_salt_passes_vllm_validation_and_is_not_the_name(tenant):
    salt = engine_cache_salt(tenant, key=b"backend-key")
    assert salt is not None and 1 <= len(salt) <= 128
    assert not VLLM_FORBIDDEN & set(salt)
    assert tenant not in salt or tenant == ""
    assert len(salt) == 43  # 256 bits of base64, as vLLM's docs advise


def test_salts_are_stable_per_tenant_and_key_and_differ_across_them():
    salt = engine_cache_salt("acme", key=b"k1")
    assert salt == engine_cache_salt("acme", key=b"k1")  # prefix hits across calls
    assert salt != engine_cache_salt("globex", key=b"k1")  # no hits across tenants
    assert salt != engine_cache_salt("acme", key=b"k2")  # not guessable without the key
    assert engine_cache_salt(None, key=b"k1") is None


def test_priority_rules_keep_the_governors_order_in_each_engines_polarity():
    governor_order = [5, 1, 0, -3]  # the governor runs larger first
    vllm = PriorityRule(enabled=True, lower_first=True, reason="declared")
    sglang = PriorityRule(enabled=True, lower_first=False, reason="default")
    assert sorted(governor_order, key=vllm.value) == governor_order  # vLLM: lower first
    assert sorted(governor_order, key=sglang.value, reverse=True) == governor_order
    assert PriorityRule(enabled=False, lower_first=True, reason="fcfs").value(5) is None


def test_vllm_priority_refusal_is_recognized_and_nothing_else_is():
    body = json.loads((FIXTURES / "vllm" / "error_priority_disabled.json").read_text())
    assert is_priority_rejection(400, body["message"])
    context = json.loads((FIXTURES / "vllm" / "error_context_length.json").read_text())
    assert not is_priority_rejection(400, context["error"]["message"])
    assert not is_priority_rejection(500, body["message"])
