"""A chat that answers from document collections, on a real tiny pair: the session
retrieves for the last user message and puts numbered sources into the prompt
within the token budget; the window ticks collections per chat, shows the sources
under the answer (also after a restart) and opens one at its page or line."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.chat.format import ChatMessage, format_for_model
from app.documents.answer import INSTRUCTIONS, conversation_renderer
from app.documents.index import DocumentIndex
from app.documents.indexer import Indexer
from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.documents import ChatDocuments
from app.session.models import ModelSpec, load_engine
from app.session.settings import ChatSettings
from app.store import Store
from tests.ui.conftest import TINY_TEMPLATE, send

QUESTION = "Who designed the Velmora bridge?"
PORT_QUESTION = "Which port does the sync daemon listen on?"
PAGES = [
    "Welcome to the city guide. This page lists opening hours of the museums and the harbour ferries.",
    "Bridges of the old town. The Velmora bridge was designed by engineer Tomas Brandt and opened in 1874.\n"
    "Its stone arches were restored after the flood of 1921.",
]
GUIDE_MD = """# Sync guide

Install the package, then start the service.

## Network

The sync daemon listens on TCP port 7443 by default.
Firewalls must let that port through.

## Logs

Log files are rotated when they reach 64 megabytes.
"""
GENERATION = {"max_tokens": 24, "draft_length": 3}  # fixed drafts: DFlash drafts every step, no calibration


@pytest.fixture(scope="module")
def byte_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny chat pair with byte tokens added to its vocabulary. Document text has capitals and
    punctuation that the plain tiny vocabulary (lowercase, digits, '.', ',') cannot tokenize:
    llama.cpp's tokenizer aborts the process on them (real models always have byte fallback)."""
    from gguf_tools import synth

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synth, "TINY_VOCAB", synth.TINY_VOCAB + [f"<0x{b:02X}>" for b in range(256) if b != 0x0A])
        return synth.write_tiny_pair(tmp_path_factory.mktemp("tiny-bytes"), "qwen3", chat_template=TINY_TEMPLATE)


@pytest.fixture
def spec(byte_pair: tuple[Path, Path]) -> ModelSpec:
    return ModelSpec(str(byte_pair[0]), str(byte_pair[1]), n_ctx=1024, n_threads=1)


def write_files(folder: Path) -> tuple[Path, Path]:
    """A two-page PDF (a real PDF writer) and a Markdown file."""
    from fpdf import FPDF

    folder.mkdir(parents=True, exist_ok=True)
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for text in PAGES:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    pdf_path = folder / "city.pdf"
    pdf.output(str(pdf_path))
    md_path = folder / "guide.md"
    md_path.write_text(GUIDE_MD)
    return pdf_path, md_path


def index_files(db: Path, collection: str, paths: list[Path]) -> None:
    with DocumentIndex(db) as index:
        index.add_roots(index.ensure_collection(collection), paths)
        prog = Indexer(index).run(collection)
    assert prog.state == "done" and prog.n_indexed == len(paths)


def test_the_renderer_keeps_the_conversation_and_puts_the_sources_with_the_last_question():
    history = [ChatMessage("system", "be brief"), ChatMessage("user", "hi"), ChatMessage("assistant", "hello")]
    plain = conversation_renderer(format_for_model(None), history)("[1] a.md, line 3\nthe text\n\n", "why?")
    # the plain format: the system text (the chat's, then the sources) first, its example turns, the chat
    assert plain.startswith(f"be brief\n\n{INSTRUCTIONS}\n\n[1] a.md, line 3\nthe text\n\n")
    assert plain.endswith("\nUser: hi\nAssistant: hello\nUser: why?\nAssistant:")
    tiny = conversation_renderer(format_for_model(TINY_TEMPLATE), history)("[1] a.md, line 3\nthe text\n\n", "why?")
    assert tiny == (f"s be brief\nu hi\na hello\nu {INSTRUCTIONS}\n\nSources:\n\n[1] a.md, line 3\nthe text\n\n"
                    "Question: why?\na ")


def test_a_chat_with_a_collection_answers_with_sources_in_the_prompt_and_stores_them(spec: ModelSpec,
                                                                                     tmp_path: Path):
    pdf, md = write_files(tmp_path / "files")
    docs_db = tmp_path / "documents.sqlite3"
    index_files(docs_db, "city", [pdf, md])
    engine = load_engine(spec)
    store = Store(tmp_path / "fd.sqlite3")
    session = ChatSession(engine, store, documents=ChatDocuments(docs_db))
    try:
        c = store.create_conversation()
        store.set_collections(c.id, ["city"])
        send_user_message(store, c.id, QUESTION)
        grounded = session.documents.prompt(engine, session.format, session.prompt_messages(c.id), ["city"], 24)
        top = grounded.sources[0]
        assert (top.name, top.page) == ("city.pdf", 2) and "Tomas Brandt" in top.text
        assert top.label() in grounded.text and grounded.text.endswith(f"Question: {QUESTION}\na ")
        assert len(engine.tokenize(grounded.text)) <= engine.n_ctx - 24 + 1  # +1: the BOS

        updates = list(session.reply(c.id, ChatSettings(**GENERATION)))
        reply = store.messages(c.id)[-1]
        assert reply.role == "assistant" and reply.status == "done"
        assert [s["n"] for s in reply.sources] == list(range(1, len(reply.sources) + 1))
        assert {k: reply.sources[0][k] for k in ("file", "page", "name")} == {
            "file": str(pdf.resolve()), "page": 2, "name": "city.pdf"}
        assert updates[-1].sources == reply.sources and "text" not in reply.sources[0]
        retrieval = reply.stats["retrieval"]
        assert retrieval["n_sources_in_prompt"] == len(reply.sources) and retrieval["collections"] == ["city"]
        assert reply.stats["generation"]["drafted"] > 0  # DFlash stayed on

        # a chat without collections: no retrieval, no sources, the documents index untouched
        plain = store.create_conversation()
        send_user_message(store, plain.id, QUESTION)
        session.documents.close()
        list(session.reply(plain.id, ChatSettings(**GENERATION)))
        other = store.messages(plain.id)[-1]
        assert other.sources == [] and "retrieval" not in other.stats and session.documents._index is None
    finally:
        session.close()
        store.close()
        engine.close()


def test_a_removed_collection_or_no_match_gives_the_plain_prompt_with_a_note(spec: ModelSpec, tmp_path: Path):
    pdf, _ = write_files(tmp_path / "files")
    docs_db = tmp_path / "documents.sqlite3"
    index_files(docs_db, "city", [pdf])
    engine = load_engine(spec)
    docs = ChatDocuments(docs_db)
    fmt = format_for_model(TINY_TEMPLATE)
    try:
        msgs = [ChatMessage("user", QUESTION)]
        gone = docs.prompt(engine, fmt, msgs, ["gone"], 24)
        assert gone.text == fmt.render(msgs) and gone.sources == []
        assert "gone" in gone.retrieval["notes"][0]
        nothing = docs.prompt(engine, fmt, [ChatMessage("user", "zyxxy qwertyuiop")], ["city", "gone"], 24)
        assert nothing.sources == [] and nothing.retrieval["n_hits"] == 0
    finally:
        docs.close()
        engine.close()


def _reply_widget(w):  # noqa: ANN001, ANN202
    return [x for x in w.chat_view.widgets if x.msg.role == "assistant"][-1]


def _click_source(qtbot, view, row: int) -> None:  # noqa: ANN001
    rect = view.visualItemRect(view.item(row))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def test_the_window_answers_from_ticked_collections_and_opens_sources_at_their_place(
        qtbot, open_window, spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001
    import app.documents.open_at as open_at_module

    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))  # the documents index the panel uses by default
    opened: list[tuple] = []

    def opener(path, page=None, line=None):  # noqa: ANN001, ANN202 - records instead of launching a viewer
        opened.append((path, page, line))
        return open_at_module.open_command(path, page, line)

    monkeypatch.setattr(open_at_module, "open_at", opener)
    pdf, md = write_files(tmp_path / "files")
    db = tmp_path / "db.sqlite3"
    w = open_window(db, spec, generation=GENERATION)
    assert w.documents_db == tmp_path / "documents.sqlite3"
    assert w.collection_picker.text() == "Documents: none"

    # index the files in the Documents panel (its own thread), as a user does
    next(a for a in w.tools_menu.actions() if a.text() == "Documents").trigger()
    panel = w.tools.documents_panel
    with qtbot.waitSignal(panel.indexingFinished, timeout=120_000):
        panel.add_paths("city", [pdf, md])

    # tick the collection for a new chat (the picker re-reads the index when its menu opens)
    conv = w.new_conversation()
    w.collection_picker.refresh()
    w.collection_picker.action_for("city").trigger()
    assert w.store.conversation(conv).collections == ["city"]
    assert w.collection_picker.text() == "Documents: city"

    send(qtbot, w, QUESTION)
    reply = w.store.messages(conv)[-1]
    assert reply.sources and reply.sources[0]["name"] == "city.pdf" and reply.sources[0]["page"] == 2
    with DocumentIndex(w.documents_db) as index:
        chunk = next(c for c in index.file_chunks(index.file(index.collection_id("city"), str(pdf.resolve())).id)
                     if c.page == 2)
    assert "Tomas Brandt" in chunk.text
    shown = _reply_widget(w)
    assert shown.sources_view.item(0).text() == "[1] city.pdf, page 2"
    assert shown.sources_view.count() == len(reply.sources) and shown.sources_label.isVisible()
    assert "τ" in shown.stats_label.text() and reply.stats["generation"]["drafted"] > 0

    # a second question in the same chat finds the Markdown file, by its lines
    send(qtbot, w, PORT_QUESTION)
    port = w.store.messages(conv)[-1].sources[0]
    assert port["name"] == "guide.md" and port["page"] is None
    lines = GUIDE_MD.splitlines()[port["line_start"] - 1:port["line_end"]]
    assert "The sync daemon listens on TCP port 7443 by default." in lines

    # a chat without collections answers as before: no sources under it
    w.new_conversation()
    assert w.collection_picker.text() == "Documents: none"
    send(qtbot, w, QUESTION)
    assert w.store.messages(w.current_conv)[-1].sources == [] and _reply_widget(w).sources_view is None

    # restart on the same database: the sources are still under the answers, and open at their place
    w.sidebar.select(conv)
    w.shutdown()
    w2 = open_window(db, None)
    assert w2.current_conv == conv and w2.collection_picker.text() == "Documents: city"
    replies = [x for x in w2.chat_view.widgets if x.msg.role == "assistant"]
    assert [r.sources_view.item(0).text() for r in replies] == [
        "[1] city.pdf, page 2", f"[1] guide.md, lines {port['line_start']}-{port['line_end']}"]
    _click_source(qtbot, replies[0].sources_view, 0)
    _click_source(qtbot, replies[1].sources_view, 0)
    assert opened == [(str(pdf.resolve()), 2, None), (str(md.resolve()), None, port["line_start"])]
    cmd = open_at_module.open_command(*opened[0])
    assert cmd[-1].startswith(str(pdf.resolve())) or str(pdf.resolve()) in cmd


def test_a_source_whose_file_is_gone_says_so_in_the_banner(qtbot, open_window, tmp_path: Path):  # noqa: ANN001
    db = tmp_path / "db.sqlite3"
    st = Store(db)
    c = st.create_conversation()
    st.add_message(c.id, "user", QUESTION)
    gone = str(tmp_path / "moved.pdf")
    st.add_message(c.id, "assistant", "Tomas Brandt.", sources=[
        {"n": 1, "file": gone, "name": "moved.pdf", "page": 2, "line_start": 1, "line_end": 3, "score": 1.0}])
    st.close()
    w = open_window(db, None)  # the real opener: it checks the file before starting any viewer
    view = _reply_widget(w).sources_view
    _click_source(qtbot, view, 0)
    assert w.banner.isVisible() and gone in w.banner.text() and "no longer there" in w.banner.text()
