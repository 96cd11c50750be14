"""The Qt-free chat session on a real tiny pair: prompts, persistence per step, a real kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.stats import GenerationStats
from app.errors import ContextOverflow
from app.session.baseline import SOURCE_PLAIN_REPLY
from app.session.chat_session import ChatSession, ReplyUpdate, drafted_chars
from app.session.conversation_ops import ConversationError, edit_user_message, prepare_regenerate, send_user_message
from app.session.models import ModelSpec, load_engine
from app.session.settings import AUTO, ChatSettings
from app.session.summary import RateSeries, RunningTotals, summarize
from app.store import Store
from app.store.records import STATUS_DONE, STATUS_INTERRUPTED, STATUS_STREAMING

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def session(tiny_chat_pair, tmp_path: Path):  # noqa: ANN001, ANN201
    engine = load_engine(ModelSpec(str(tiny_chat_pair[0]), str(tiny_chat_pair[1]), n_ctx=1024))
    store = Store(tmp_path / "fd.sqlite3")
    yield ChatSession(engine, store)
    store.close()
    engine.close()


def test_the_prompt_is_the_conversation_in_the_models_template(session: ChatSession):
    st = session.store
    c = st.create_conversation(system_prompt="be brief")
    send_user_message(st, c.id, "hello")
    st.add_message(c.id, "assistant", "hi")
    send_user_message(st, c.id, "again")
    assert session.format.name == "model template"
    text = session.format.render(session.prompt_messages(c.id))
    assert text == "s be brief\nu hello\na hi\nu again\na "


def test_every_step_is_in_the_database_before_it_is_shown(session: ChatSession, tmp_path: Path):
    c = session.store.create_conversation()
    send_user_message(session.store, c.id, "hello there")
    other = Store(tmp_path / "fd.sqlite3")  # another connection, as after a restart
    n = 0
    for u in session.reply(c.id, ChatSettings(max_tokens=30, draft_length=3)):
        m = other.message(u.message_id)
        assert m.content == u.content
        assert m.status == (STATUS_STREAMING if u.finish_reason is None else STATUS_DONE)
        assert m.stats["summary"]["n_generated"] == u.stats.n_generated
        n += 1
    assert n > 1
    final = other.message(u.message_id)
    assert final.stats["generation"]["k_history"] and final.stats["tps_series"] == [round(x, 2)
                                                                                  for x in u.tps_series]


def test_the_baseline_is_plain_replies_beside_the_users_store_and_leaves_it_as_it_was(session: ChatSession,
                                                                                      tmp_path: Path):
    c = session.store.create_conversation(title="mine")
    send_user_message(session.store, c.id, "hello")
    before = sorted(p.name for p in tmp_path.iterdir())
    b = session.measure_baseline()
    assert b.source == SOURCE_PLAIN_REPLY and b.tokens_per_s > 0 and b.n_tokens > 1
    assert session.baseline is b
    # the replies went to a scratch store in the same directory, removed after: the user's chats are as they were
    assert [x.title for x in session.store.conversations()] == ["mine"]
    assert [m.content for m in session.store.messages(c.id)] == ["hello"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_in_memory_stores_baseline_writes_nowhere(tiny_chat_pair, tmp_path: Path, monkeypatch):  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    engine = load_engine(ModelSpec(str(tiny_chat_pair[0]), str(tiny_chat_pair[1]), n_ctx=1024))
    store = Store(":memory:")
    try:
        assert ChatSession(engine, store).measure_baseline().tokens_per_s > 0
        assert store.conversations() == [] and list(tmp_path.iterdir()) == []
    finally:
        store.close()
        engine.close()


def test_a_killed_app_keeps_the_text_it_had_shown(tiny_chat_pair, tmp_path: Path):
    db = tmp_path / "fd.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, str(REPO / "tests/ui/kill_child.py"), str(tiny_chat_pair[0]),
                              str(tiny_chat_pair[1]), str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    shown = ""
    try:
        for _ in range(3):
            line = json.loads(child.stdout.readline())
            shown += line["delta"]
            child.stdin.write("\n")
            child.stdin.flush()
        line = json.loads(child.stdout.readline())  # a 4th step shown, then the process dies
        shown += line["delta"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    store = Store(db)
    assert store.recover_interrupted() == 1
    msg = store.message(line["message_id"])
    assert msg.status == STATUS_INTERRUPTED and msg.content == shown and shown


def test_context_overflow_is_reported_and_leaves_no_empty_reply(tiny_chat_pair, tmp_path: Path):
    engine = load_engine(ModelSpec(str(tiny_chat_pair[0]), str(tiny_chat_pair[1]), n_ctx=64))
    store = Store(tmp_path / "fd.sqlite3")
    s = ChatSession(engine, store)
    c = store.create_conversation()
    send_user_message(store, c.id, "hello")
    with pytest.raises(ContextOverflow, match="context holds"):
        next(s.reply(c.id, ChatSettings(max_tokens=500)))
    assert [m.role for m in store.messages(c.id)] == ["user"]
    engine.close()


def test_a_conversation_must_end_with_a_user_message(session: ChatSession):
    c = session.store.create_conversation()
    with pytest.raises(ConversationError):
        next(session.reply(c.id, ChatSettings()))


def test_regenerate_and_edit_rewind_the_conversation(tmp_path: Path):
    st = Store(tmp_path / "fd.sqlite3")
    c = st.create_conversation()
    u1 = send_user_message(st, c.id, "What is DFlash, and why is it fast? Explain in detail please")
    assert st.conversation(c.id).title.startswith("What is DFlash") and len(st.conversation(c.id).title) <= 48
    st.add_message(c.id, "assistant", "a")
    send_user_message(st, c.id, "more")
    st.add_message(c.id, "assistant", "b")
    assert prepare_regenerate(st, c.id).content == "more"
    assert [m.content for m in st.messages(c.id)] == [u1.content, "a", "more"]
    edit_user_message(st, u1.id, "new question")
    assert [m.content for m in st.messages(c.id)] == ["new question"]
    a = st.add_message(c.id, "assistant", "x")
    with pytest.raises(ConversationError, match="only user messages"):
        edit_user_message(st, a.id, "y")
    with pytest.raises(ConversationError, match="empty"):
        send_user_message(st, c.id, "   ")


def test_settings_map_to_generation_params():
    auto = ChatSettings().to_params(["\nUser:"])
    assert auto.adaptive and auto.draft_max is None and auto.stop == ["\nUser:"]
    fixed = ChatSettings(draft_length=5, temperature=0.7, speculative=False).to_params([])
    assert (fixed.adaptive, fixed.draft_max, fixed.temperature, fixed.speculative) == (False, 5, 0.7, False)
    # values read back from disk are checked one by one; a bad one keeps its default
    s = ChatSettings.from_dict({"draft_length": 99, "top_p": 0.0, "max_tokens": 17, "bogus": 1})
    assert (s.draft_length, s.top_p, s.max_tokens) == (AUTO, 1.0, 17)
    assert ChatSettings(max_tokens=5).diff(ChatSettings()) == {"max_tokens": 5}


def test_running_totals_are_ratios_of_sums():
    a = GenerationStats(block_size=4, n_generated=10, steps=5, accepted=5, t_decode_s=1.0)
    b = GenerationStats(block_size=4, n_generated=30, steps=10, accepted=20, t_decode_s=1.0)
    before = RunningTotals()
    before.add(a)
    s = summarize(b, before, baseline_tps=10.0, baseline_source="plain run")
    assert s.tau == pytest.approx(3.0) and s.tau_running == pytest.approx((10 + 30) / 15)
    assert s.tokens_per_s == pytest.approx(30.0) and s.speedup == pytest.approx(3.0)
    assert s.tokens_per_s_running == pytest.approx(20.0) and s.speedup_running == pytest.approx(2.0)
    assert summarize(b, RunningTotals(), None).speedup is None


def test_rate_series_keeps_the_whole_reply_in_bounded_points():
    r = RateSeries(window_s=0.1, max_points=50)
    for i in range(1, 400):
        r.add(i * 0.01, i)  # 100 tokens/s throughout
    assert len(r.points) <= 50 and r.points[-1] == pytest.approx(100.0)


@pytest.mark.parametrize("fmt,kind", [(None, "DFlash drafter"), ("dflash2", "DFlash2 drafter"),
                                      ("dspark", "DSpark drafter")])
def test_the_stats_panel_names_the_drafter_the_dflash_source_runs(qtbot, tiny_chat_pair, tmp_path: Path,  # noqa: ANN001
                                                                 fmt: str | None, kind: str):
    """The dflash source runs DFlash v1, DFlash2 and DSpark drafters: each reply's summary names the
    loaded one (the words of the Model panel's line), and the stats panel shows that name."""
    from app.ui.stats_panel import StatsPanel
    from gguf_tools.synth import DFlash2Shape, DSparkShape, write_drafter

    target = tiny_chat_pair[0]
    drafter = tiny_chat_pair[1] if fmt is None else write_drafter(
        tmp_path / f"tiny-{fmt}.gguf", target, n_layer=2, target_layers=[1, 3], block_size=8,
        dflash2=DFlash2Shape() if fmt == "dflash2" else None, dspark=DSparkShape() if fmt == "dspark" else None)
    engine = load_engine(ModelSpec(str(target), str(drafter), n_ctx=512, n_threads=1))
    store = Store(tmp_path / "fd.sqlite3")
    try:
        s = ChatSession(engine, store)
        c = store.create_conversation()
        send_user_message(store, c.id, "hello there")
        *_, last = s.reply(c.id, ChatSettings(max_tokens=12, draft_length=3))  # DFlash's block every step
        assert last.summary.drafted_by_source.get("dflash") and last.summary.source_labels == {"dflash": kind}
        assert store.message(last.message_id).stats["summary"]["source_labels"] == {"dflash": kind}
        panel = StatsPanel()
        qtbot.addWidget(panel)
        panel.show_record(store.message(last.message_id).stats, "Finished")
        assert panel.source_label.text().split("<br>")[1].split("</span> ")[1].startswith(f"{kind} ")
    finally:
        store.close()
        engine.close()


def test_an_update_after_another_carries_both_steps_text_and_its_leading_drafted_chars():
    def update(delta: str, drafted: int) -> ReplyUpdate:
        return ReplyUpdate(conversation_id=1, message_id=1, delta=delta, drafted_chars=drafted, content="",
                           status=STATUS_STREAMING, stats=GenerationStats(), summary=None, record={})
    assert update("cd", 2).after(update("ab", 2)).drafted_chars == 4  # all drafted: the run goes on
    assert update("cd", 2).after(update("ab", 1)).drafted_chars == 1  # a target token ends the run
    merged = update("e", 0).after(update("cd", 1).after(update("ab", 2)))
    assert merged.delta == "abcde" and merged.drafted_chars == 3


def test_drafted_chars_count_the_accepted_draft_tokens(session: ChatSession):
    toks = session.engine.tokenize("the cat", add_special=False)
    text = session.engine.detokenize(toks)
    assert drafted_chars(session.engine, toks, [True] * (len(toks) - 1) + [False], len(text)) == len(
        session.engine.detokenize(toks[:-1]))
    assert drafted_chars(session.engine, toks, [False] * len(toks), len(text)) == 0
