"""A generated tool output: its category, the call that produced it, its text, and which of
its lines are errors (ascending indexes into ``text.split("\\n")``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = ["Category", "Document"]


class Category(Enum):
    TEST_LOG = "test_log"
    JSON_API = "json_api"
    DIRECTORY_LISTING = "directory_listing"
    STACK_TRACE = "stack_trace"
    WEB_PAGE = "web_page"


@dataclass(frozen=True, slots=True)
class Document:
    """One tool output, the call that produced it, and which of its lines are errors."""

    name: str  # category, stratum and flavour: "test_log-03-pytest"
    category: Category
    tool_name: str
    arguments: Mapping[str, str]
    text: str
    error_lines: tuple[int, ...]  # indexes into text.split("\n"), ascending

    @property
    def error_texts(self) -> tuple[str, ...]:
        lines = self.text.split("\n")
        return tuple(lines[i] for i in self.error_lines)
