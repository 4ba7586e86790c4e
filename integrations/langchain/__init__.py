"""LangChain within the governor: ``GovernorMiddleware`` for ``create_agent``, the
``GovernedChatModel`` over any governor ``Backend``, the ``GovernorState`` the middleware
keeps its counters in, and ``to_chat``/``to_chats``, LangChain messages as the chat dicts
``Governor.complete`` takes (the converter the middleware and ``govern`` use).
"""

from __future__ import annotations

from integrations._messages import to_chat, to_chats
from integrations.langchain._model import GovernedChatModel
from integrations.langchain._state import GovernorState
from integrations.langchain.middleware import GovernorMiddleware

__all__ = ["GovernedChatModel", "GovernorMiddleware", "GovernorState", "to_chat", "to_chats"]
