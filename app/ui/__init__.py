"""The PySide6 desktop app. Widgets bind to models; the engine lives in a worker thread."""
