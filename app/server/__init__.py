"""The OpenAI-compatible local server: `flashdesk serve`, and the app's Server panel.

    config.py    what a server is started with, and the bind rule (loopback, or a key)
    schemas.py   the request bodies (pydantic), parsed strictly into a GenerationRequest
    service.py   one engine, one generation at a time: the bounded queue, the jobs, the log
    replies.py   OpenAI response objects, chunks and the `timings` of a finished generation
    app.py       the FastAPI app: routes, the API key, limits, errors as {"error": {...}}
    runner.py    uvicorn on a socket bound up front, in the foreground or in a thread
    bench.py     tokens/s through the server against Engine.complete (JSON)

The engine is touched only in the thread that owns it: an EngineExecutor runs each
job there (a thread of its own for `flashdesk serve`, the UI's engine worker in the app).
"""
