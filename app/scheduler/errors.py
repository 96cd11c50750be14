"""Errors of the scheduler, shown to the user as they are."""

from __future__ import annotations

from app.errors import FlashDeskError


class PlanInputError(FlashDeskError):
    """A device description, a model file or a plan parameter the planner cannot use."""
