"""``TokenCounter`` keeps the counts of long texts it counts again (a conversation is
counted at every turn): from the third time on, a text is looked up, not counted. A
text counted once (a tool output's lines, a summarizer's drafts) leaves only its hash.
The characters held are bounded."""

from __future__ import annotations

import threading

import pytest

from governor import tokens
from governor.tokens import TokenCounter


class _CountingTokenizer:
    """One token per word; remembers each text it was asked to encode."""

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return [len(word) for word in text.split()]


def _text(number: int, words: int = 40) -> str:
    return " ".join(f"word{number}_{i}" for i in range(words))


def test_a_long_text_counted_twice_is_looked_up_after_even_as_a_new_string() -> None:
    tokenizer = _CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    text = _text(1)
    copy = "".join(list(text))  # equal, but another object (as a checkpointer gives back)
    assert copy is not text
    counts = [counter.count(text), counter.count(text), counter.count(copy), counter.count(text)]
    assert counts == [40] * 4
    assert tokenizer.encoded == [text, text]


def test_a_text_counted_once_is_not_kept() -> None:
    counter = TokenCounter(tokenizer=_CountingTokenizer())
    for number in range(100):
        counter.count(_text(number))
    assert counter._long._counts == {}
    assert len(counter._long._seen) == 100


def test_a_conversation_counted_at_each_turn_counts_only_its_new_messages() -> None:
    tokenizer = _CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    conversation = [{"role": "user", "content": _text(0)}]
    for turn in range(1, 5):
        tokenizer.encoded.clear()
        counter.count_messages(conversation)
        counted = [t for t in tokenizer.encoded if len(t) > 64]
        # each message is counted at its first two turns, then looked up
        assert counted == [_text(n) for n in range(max(0, turn - 2), turn)]
        conversation.append({"role": "tool", "content": _text(turn)})


def test_the_least_recently_counted_texts_go_first_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text_chars = len(_text(0))
    monkeypatch.setattr(tokens, "_LONG_KEPT", 10 * text_chars)
    tokenizer = _CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    for number in [*range(10), *range(10)]:  # counted twice: kept
        counter.count(_text(number))
    counter.count(_text(0))  # used again: now the most recent
    counter.count(_text(10))
    counter.count(_text(10))  # kept, over the bound: text 1 goes, not text 0
    tokenizer.encoded.clear()
    counter.count(_text(0))
    assert tokenizer.encoded == []
    counter.count(_text(1))
    assert tokenizer.encoded == [_text(1)]
    held = counter._long._counts
    assert sum(map(len, held)) == counter._long._chars <= 10 * text_chars


def test_a_text_longer_than_an_eighth_of_the_bound_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens, "_LONG_KEPT", 8 * 100)
    tokenizer = _CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    text = _text(1)  # over 100 characters
    for _ in range(3):
        counter.count(text)
    assert tokenizer.encoded == [text, text, text]
    assert counter._long._counts == {}


def test_truncation_probes_and_str_subclasses_are_not_kept() -> None:
    class Marked(str):
        pass

    tokenizer = _CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    for _ in range(3):
        counter.truncate(_text(1, words=400), 100)
    marked = Marked(_text(2))
    assert counter.count(marked) == counter.count(marked) == counter.count(marked) == 40
    assert counter._long._counts == {}


def test_threads_share_the_counts_and_the_bound_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_LONG_KEPT", 20 * len(_text(0)))
    counter = TokenCounter()  # tiktoken, as a governor counts by default
    texts = [_text(number) for number in range(60)]
    expected = [counter._length(text) for text in texts]
    wrong: list[int] = []

    def work(offset: int) -> None:
        for round_ in range(20):
            for index in range(offset, len(texts), 3):
                index = (index + round_) % len(texts)
                if counter.count(texts[index]) != expected[index]:
                    wrong.append(index)

    threads = [threading.Thread(target=work, args=(offset % 3,)) for offset in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    held = counter._long._counts
    assert sum(map(len, held)) == counter._long._chars <= tokens._LONG_KEPT
    assert all(held[text] == expected[texts.index(text)] for text in held)


class _TemplateTokenizer(_CountingTokenizer):
    """Renders a chat to text, as the engine's tokenizer and transformers' do."""

    chat_template = "roles and contents"

    def apply_chat_template(self, messages: list[dict[str, str]], **_: object) -> str:
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"


def test_a_conversation_counted_again_is_looked_up_not_encoded_again() -> None:
    """A governor counts the same conversation several times in one turn (the ceiling,
    then the call): from the third count on, no tokenizer work."""
    tokenizer = _TemplateTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    chat = [{"role": "system", "content": _text(1)}, {"role": "user", "content": _text(2)}]
    counts = [counter.count_messages(chat) for _ in range(4)]
    assert counts == [counts[0]] * 4 and counts[0] == 83  # 2 roles + 80 words + priming
    assert len(tokenizer.encoded) == 2
