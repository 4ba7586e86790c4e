"""``kvgov serve``: the bundled engine as a governed, OpenAI-compatible HTTP server."""

from kvgov.serve.app import create_app
from kvgov.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]
