"""Engine errors raised through ``LocalBackend``: each as its own engine class made a
``governor.errors.BackendError`` too, with the same message and fields.

Engine-aware code catches ``engine.errors.BudgetExceededError``, backend-agnostic code
catches ``BackendError``, and neither loses information. The derived classes are built
once per engine class and pickle (a process pool, a multiprocessing queue) back to the
same derived class. This module never imports engine/ (``LocalBackend`` alone does):
the caller hands over the engine's base error class and its closed-loop error.
"""

from __future__ import annotations

import functools
from typing import Any, NoReturn, cast

from governor import BackendError

__all__ = ["EngineErrors", "reraise"]

# (engine.errors.EngineError, engine.engine_loop.EngineLoopClosedError)
EngineErrors = tuple[type[BaseException], type[BaseException]]


def reraise(exc: BaseException, *, backend: str, engine_errors: EngineErrors) -> NoReturn:
    """Raise an engine error as its class made a ``BackendError`` too, same message and
    fields, from the original; anything else (an engine bug) as it is."""
    engine_error, loop_closed = engine_errors
    if isinstance(exc, loop_closed):
        closed = "this LocalBackend is closed; create a new one"
        raise BackendError(closed, backend=backend) from exc
    if not isinstance(exc, engine_error) or isinstance(exc, BackendError):
        raise exc
    # mypy checks a class against Hashable by its instances' __hash__; a class is hashable.
    cls = _backend_error_class(type(exc))  # type: ignore[arg-type]  # see above
    error = cls.__new__(cls, *exc.args)
    error.__dict__.update(exc.__dict__)
    error.problem = str(exc)
    error.backend = backend
    raise error from exc


@functools.cache
def _backend_error_class(engine_error: type[BaseException]) -> type[BackendError]:
    # type() says "type"; the class built is a BackendError, its second base.
    return cast(
        "type[BackendError]",
        type(
            engine_error.__name__,
            (engine_error, BackendError),
            {
                "__module__": __name__,
                "__doc__": engine_error.__doc__,
                "__reduce__": _reduce_backend_error,
            },
        ),
    )


def _reduce_backend_error(error: BaseException) -> tuple[Any, ...]:
    engine_error = type(error).__mro__[1]  # the class was built as (engine class, BackendError)
    return (_rebuild_backend_error, (engine_error, error.args), error.__dict__)


def _rebuild_backend_error(engine_error: type[BaseException], args: tuple[Any, ...]) -> Any:
    cls = _backend_error_class(engine_error)  # type: ignore[arg-type]  # as in reraise: hashable
    return cls.__new__(cls, *args)
