"""FlashDesk: fast local chat through DFlash speculative decoding."""

__version__ = "0.1.0"
