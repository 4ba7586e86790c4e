"""``error_from_response`` and ``remote_error_class`` against a server that names its
errors as it likes: the classes kept stay bounded, a name that is not a class name
builds none, and the server's fields never replace what the client sets on an error
(``retriable``, ``status_code``, ``backend``, ``problem``). Bodies are built here: what is
checked is the client's reading of them, not a server."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from backends.http import errors as _remote_errors
from backends.http.errors import error_from_response, remote_error_class
from governor import BackendError, BackendUnavailable


def _body(error_class: str, fields: dict[str, Any], retriable: bool | None = None) -> bytes:
    detail: dict[str, Any] = {"error_class": error_class, "fields": fields}
    if retriable is not None:
        detail["retriable"] = retriable
    return json.dumps({"error": {"message": "refused", "type": "x", "kvgov": detail}}).encode()


def test_server_named_classes_are_kept_for_a_bounded_number_of_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_remote_errors, "_classes", {})  # this test's names only
    first = remote_error_class("UnknownBudgetError")
    assert first is remote_error_class("UnknownBudgetError")  # built once, kept
    for i in range(_remote_errors._MAX_CLASSES * 4):
        error = error_from_response(400, _body(f"Made{i}Error", {}), backend="remote")
        assert type(error).__name__ == f"Made{i}Error" and isinstance(error, BackendError)
    assert len(_remote_errors._classes) == _remote_errors._MAX_CLASSES
    assert remote_error_class("UnknownBudgetError") is first
    late = error_from_response(400, _body("LateError", {"needed": 3}), backend="remote")
    again = pickle.loads(pickle.dumps(late))  # built again on the way back: same name, fields
    assert (type(again).__name__, again.needed, str(again)) == ("LateError", 3, str(late))
    for name in ("not a class", "x" * 1_000, "A.B", "1Error"):
        error = error_from_response(400, _body(name, {}), backend="remote")
        assert type(error) is BackendError and error.error_class == name[:100]
    assert len(_remote_errors._classes) == _remote_errors._MAX_CLASSES


def test_the_servers_fields_never_replace_the_clients_own() -> None:
    own = {
        "retriable": True,
        "status_code": 200,
        "backend": "evil",
        "problem": "evil",
        "args": ["evil"],
        "_secret": 1,
        "needed": 7,
    }
    error = error_from_response(409, _body("DuplicateBudgetError", own), backend="remote")
    assert (error.retriable, error.status_code, error.backend) == (False, 409, "remote")
    assert error.problem == "refused" and error.args == ("refused",)
    assert error.needed == 7 and not hasattr(error, "_secret")
    # the server's own flag, not a field, says whether to retry
    retriable = error_from_response(409, _body("BusyError", {}, retriable=True), backend="r")
    assert retriable.retriable
    down = error_from_response(503, _body("EngineDown", {"retriable": False}), backend="remote")
    assert isinstance(down, BackendUnavailable) and down.retriable and down.status_code == 503
    garbage = {"error": {"message": "m", "kvgov": {"error_class": "E", "fields": [1, 2]}}}
    assert type(error_from_response(400, json.dumps(garbage).encode(), backend="r")).__name__ == "E"
    long = json.dumps({"error": {"message": "m" * 100_000}}).encode()
    assert len(str(error_from_response(400, long, backend="r"))) < 3_000
