"""``settle`` predicts the state's messages after a node without calling the reducer when
``add_messages`` would only append (``integrations.langgraph._node._merge``): the prediction
must be exactly what ``add_messages`` gives, for any mix of kept, new, replacing and
removing messages."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.graph.message import add_messages

from integrations.langgraph._node import _merge

# What a node may return, message by message: one of the state's own messages again
# (a subgraph returns the state it was given), a new message with a fresh id, with no
# id, with the id of a message already in the state (a replacement), twice the same new
# id, or a removal of a message in the state.
_KINDS = st.sampled_from(["kept", "fresh", "no_id", "replaces", "duplicate", "removes"])


def _state(size: int) -> list[BaseMessage]:
    return [
        HumanMessage(f"m{i}", id=f"s{i}") if i % 2 else AIMessage(f"m{i}", id=f"s{i}")
        for i in range(size)
    ]


def _added(left: list[BaseMessage], kinds: list[str], picks: list[int]) -> list[BaseMessage]:
    added: list[BaseMessage] = []
    for n, (kind, pick) in enumerate(zip(kinds, picks, strict=True)):
        target = left[pick % len(left)] if left else None
        if kind == "kept" and target is not None:
            added.append(target)
        elif kind == "replaces" and target is not None:
            added.append(AIMessage(f"new {n}", id=target.id))
        elif kind == "removes" and target is not None:
            added.append(RemoveMessage(id=str(target.id)))
        elif kind == "duplicate":
            added.extend([AIMessage("a", id="dup"), AIMessage("b", id="dup")])
        elif kind == "no_id":
            added.append(AIMessage(f"plain {n}"))
        else:
            added.append(AIMessage(f"fresh {n}", id=f"f{n}"))
    return added


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(0, 5),
    kinds=st.lists(_KINDS, max_size=6),
    data=st.data(),
)
def test_the_merge_is_what_add_messages_gives(
    size: int, kinds: list[str], data: st.DataObject
) -> None:
    picks = data.draw(st.lists(st.integers(0, 10), min_size=len(kinds), max_size=len(kinds)))
    left = _state(size)
    added = _added(left, kinds, picks)
    predicted = _merge(add_messages, list(left), list(added))
    # add_messages gives ids to messages without one, in place: compare once it has.
    expected = add_messages(list(left), list(added))
    assert [(type(m), m.id, m.content) for m in predicted] == [
        (type(m), m.id, m.content) for m in expected
    ]
    assert all(p is e for p, e in zip(predicted, expected, strict=True))
