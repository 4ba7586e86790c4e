"""What kvgov loads without a network, shared by the layers that load it (engine/'s
tokenizer and governor/'s token counter): nothing here imports another kvgov package."""

from __future__ import annotations

from offline.encodings import OFFLINE_SUFFIX, loads_offline

__all__ = ["OFFLINE_SUFFIX", "loads_offline"]
