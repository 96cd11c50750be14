"""Child process for the kill test: streams a reply, printing each step, and waits for a go-ahead
line on stdin before each next step, so the parent can kill it at a known point."""

from __future__ import annotations

import json
import sys

from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.models import ModelSpec, load_engine
from app.session.settings import ChatSettings
from app.store import Store

target, drafter, db = sys.argv[1:4]
engine = load_engine(ModelSpec(target, drafter, n_ctx=1024))
store = Store(db)
conv = store.create_conversation()
send_user_message(store, conv.id, "tell me a long story")
for u in ChatSession(engine, store).reply(conv.id, ChatSettings(max_tokens=200, draft_length=2)):
    print(json.dumps({"delta": u.delta, "message_id": u.message_id}), flush=True)
    sys.stdin.readline()
