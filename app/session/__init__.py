"""The Qt-free chat session: conversation -> prompt -> engine -> persisted reply."""
