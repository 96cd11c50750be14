"""The one guard for slots of worker signals that can arrive after the window shut down.

The worker thread can emit (a reply step, a load stage, a plan) while the window
shuts down; Qt queues those signals and delivers them once the event loop runs
again, after the store and the worker are closed. A guarded slot then does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar


class ShutsDown(Protocol):
    shut_down: bool  # True from the start of shutdown() on


Owner = TypeVar("Owner", bound=ShutsDown)
Args = ParamSpec("Args")


def skip_after_shutdown(slot: Callable[Concatenate[Owner, Args], None]) -> Callable[Concatenate[Owner, Args], None]:
    """Decorate a slot so it returns at once once its owner has shut down."""

    @functools.wraps(slot)
    def guarded(owner: Owner, *args: Args.args, **kwargs: Args.kwargs) -> None:
        if owner.shut_down:
            return
        slot(owner, *args, **kwargs)

    return guarded
