"""``integrations._messages``: LangChain messages as the governor's chat dicts, and back."""

from __future__ import annotations

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from governor import TokenCounter
from integrations._messages import ID_KEY, from_chat, reported_usage, restore, to_chat, to_chats

CONVERSATION: list[BaseMessage] = [
    SystemMessage("Be brief.", id="s"),
    HumanMessage("Find the flaky test.", id="h", name="ada"),
    AIMessage("", id="a", tool_calls=[{"id": "c1", "name": "grep", "args": {"pattern": "flaky"}}]),
    ToolMessage("tests/test_io.py:12: flaky", tool_call_id="c1", name="grep", id="t"),
    AIMessage([{"type": "text", "text": "It is "}, "test_io."], id="b"),
    ChatMessage(role="critic", content="Check twice.", id="c"),
]


def test_dicts_count_as_the_messages_do() -> None:
    counter = TokenCounter()
    plain = [m for m in CONVERSATION if isinstance(m.content, str)]
    assert counter.count_messages(to_chats(plain)) == counter.count_messages(plain)


def test_to_chat_maps_roles_calls_and_text_parts() -> None:
    chats = to_chats(CONVERSATION)
    assert [c["role"] for c in chats] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "critic",
    ]
    assert chats[1]["name"] == "ada"
    assert chats[2]["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "grep", "arguments": {"pattern": "flaky"}},
        }
    ]
    assert chats[3]["tool_call_id"] == "c1"
    assert chats[4]["content"] == "It is test_io."  # text parts joined
    image = HumanMessage([{"type": "image", "url": "x.png"}, "caption"])
    assert to_chat(image)["content"] == [
        {"type": "image", "url": "x.png"},
        {"type": "text", "text": "caption"},
    ]


def test_from_chat_round_trips_a_dict() -> None:
    for message in CONVERSATION:
        chat = to_chat(message)
        assert to_chat(from_chat(chat)) == chat
    wire = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "ls", "arguments": '{"d": "."}'}}
        ],
    }
    rebuilt = from_chat(wire)
    assert isinstance(rebuilt, AIMessage) and rebuilt.tool_calls[0]["args"] == {"d": "."}


def test_restore_keeps_the_originals_and_makes_the_rest_new() -> None:
    chats = to_chats(CONVERSATION)
    summary = {"role": "user", "content": "[Summary of 3 earlier messages]\nflaky io"}
    compacted = [chats[0], chats[1], summary, chats[4], chats[5]]
    restored = restore(compacted, CONVERSATION, chats)
    assert restored[0] is CONVERSATION[0] and restored[1] is CONVERSATION[1]
    assert restored[3] is CONVERSATION[4] and restored[4] is CONVERSATION[5]
    assert isinstance(restored[2], HumanMessage) and restored[2].id is None
    assert restored[2].content == summary["content"]


def test_restore_matches_ids_keeps_rewritten_originals_and_leaves_out_the_prefix() -> None:
    chats = to_chats(CONVERSATION, ids=True)
    assert [c[ID_KEY] for c in chats] == ["s", "h", "a", "t", "b", "c"]
    assert ID_KEY not in to_chat(CONVERSATION[0])  # never sent to a backend
    prefix = [{"role": "system", "content": "House rules."}]
    shorter = {**chats[3], "content": "flaky"}  # a policy that rewrote the tool result
    compacted = [*prefix, chats[0], chats[2], shorter, chats[5]]
    restored = restore(compacted, CONVERSATION, chats, prefix=prefix)
    assert restored[0] is CONVERSATION[0] and restored[1] is CONVERSATION[2]
    assert restored[3] is CONVERSATION[5]
    assert isinstance(restored[2], ToolMessage) and restored[2].content == "flaky"
    assert restored[2].id == "t" and restored[2].tool_call_id == "c1"
    # Not at the head, a dict equal to the prefix's is the conversation's own.
    restored = restore([chats[0], *prefix], CONVERSATION, chats, prefix=prefix)
    assert len(restored) == 2 and restored[1].content == "House rules."


def test_reported_usage_reads_usage_metadata() -> None:
    assert reported_usage(AIMessage("hi")) is None
    usage = {
        "input_tokens": 12,
        "output_tokens": 3,
        "total_tokens": 15,
        "input_token_details": {"cache_read": 8},
    }
    reply = AIMessage("hi", usage_metadata=usage, response_metadata={"finish_reason": "length"})
    assert reported_usage(reply) == {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "cached_tokens": 8,
        "finish_reason": "length",
    }
