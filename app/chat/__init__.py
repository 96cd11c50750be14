"""Conversations as prompt text: chat templates and the plain fallback format."""
