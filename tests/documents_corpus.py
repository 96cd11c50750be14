"""A corpus of real files for the document Q&A tests: PDFs written by fpdf2 (with
page numbers in a footer), a DOCX by python-docx, Markdown, HTML, text and
Python source, plus broken ones (damaged PDF, password-protected PDF, image-only
PDF, damaged DOCX, binary .txt). Each question's answer sits in one known place
(file, page); filler paragraphs share the questions' vocabulary so retrieval
has to rank, not just match.

    python tests/documents_corpus.py OUT_DIR [--scale N]   (N copies: for throughput runs)
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Question:
    question: str
    answer: str  # a string found (whitespace-normalised) only in the answering chunk(s)
    file: str  # file name inside the corpus
    page: int | None = None


@dataclass
class Fact:
    file: str
    page: int | None
    sentence: str
    question: str
    answer: str


FACTS = [
    # handbook.pdf
    Fact("handbook.pdf", 2, "The Velmora bridge was designed by engineer Tomas Brandt and opened to traffic in 1874.",
         "Who designed the Velmora bridge?", "Tomas Brandt"),
    Fact("handbook.pdf", 2, "Visitors to the Orlin observatory must book the night telescope session at least nine "
         "days ahead.", "How far ahead must the night telescope session at the Orlin observatory be booked?",
         "nine days ahead"),
    Fact("handbook.pdf", 3, "The cafeteria on the fourth floor serves a lentil soup called Marrow Pot every Thursday.",
         "What soup does the cafeteria serve on Thursdays?", "Marrow Pot"),
    Fact("handbook.pdf", 4, "New employees collect their hardware security token from the security desk in room "
         "B-217.", "In which room do new employees get their hardware security token?", "B-217"),
    Fact("handbook.pdf", 5, "The annual hackathon, called Forge Week, takes place during the second week of March.",
         "When does the Forge Week hackathon take place?", "second week of March"),
    Fact("handbook.pdf", 6, "Parking permits for bicycles are issued by Greta Holm in the facilities office.",
         "Who issues parking permits for bicycles?", "Greta Holm"),
    Fact("handbook.pdf", 7, "The emergency assembly point for the north wing is the car park beside the water tower.",
         "Where is the emergency assembly point for the north wing?", "beside the water tower"),
    Fact("handbook.pdf", 8, "Expense claims above 4,000 crowns need the approval of the regional director.",
         "Which expense claims need approval of the regional director?", "4,000 crowns"),
    # report.pdf
    Fact("report.pdf", 1, "Revenue from the Nordic segment grew by 17.4 percent compared with the previous year.",
         "By how much did revenue from the Nordic segment grow?", "17.4 percent"),
    Fact("report.pdf", 2, "The Tallinn warehouse was closed in August because its lease could not be renewed.",
         "Why was the Tallinn warehouse closed?", "lease could not be renewed"),
    Fact("report.pdf", 3, "Customer churn in the subscription business fell to 3.1 percent per quarter.",
         "What was the quarterly customer churn in the subscription business?", "3.1 percent"),
    Fact("report.pdf", 4, "The board approved a dividend of 2.35 euros per share.",
         "What dividend per share did the board approve?", "2.35 euros"),
    Fact("report.pdf", 5, "Most carbon emissions came from the diesel generators at the Harstad site.",
         "Where did most carbon emissions come from?", "diesel generators at the Harstad site"),
    # minutes.docx
    Fact("minutes.docx", None, "The committee elected Priya Raman as treasurer for the coming term.",
         "Who was elected treasurer?", "Priya Raman"),
    Fact("minutes.docx", None, "The spring fundraiser will be held at Linden Hall on 14 May.",
         "Where will the spring fundraiser be held?", "Linden Hall"),
    Fact("minutes.docx", None, "TABLE:Kestrel|backup server|basement rack 4",
         "Where is the Kestrel backup server?", "basement rack 4"),
    Fact("minutes.docx", None, "Membership fees rise from 40 to 55 dollars starting in January.",
         "How much are membership fees from January?", "55 dollars"),
    Fact("minutes.docx", None, "From now on the newsletter will be edited by Jonas Weber.",
         "Who will edit the newsletter?", "Jonas Weber"),
    # guide.md
    Fact("guide.md", None, "The sync daemon listens on TCP port 7443 by default.",
         "Which port does the sync daemon listen on?", "7443"),
    Fact("guide.md", None, "CODE:To delete old snapshots, run the prune command:|flashsync prune --older-than 30d",
         "What command deletes old snapshots?", "flashsync prune --older-than 30d"),
    Fact("guide.md", None, "Log files are rotated when they reach 64 megabytes.",
         "When are log files rotated?", "64 megabytes"),
    Fact("guide.md", None, "Snapshots are encrypted with the XChaCha20 cipher before upload.",
         "Which cipher encrypts snapshots before upload?", "XChaCha20"),
    # faq.html
    Fact("faq.html", None, "Refunds are processed within 12 business days of receiving the returned item.",
         "How long does it take to process a refund?", "12 business days"),
    Fact("faq.html", None, "Our support line is open from 7:00 to 19:00 on weekdays.",
         "When is the support line open?", "7:00 to 19:00"),
    Fact("faq.html", None, "Gift cards expire 36 months after purchase.",
         "When do gift cards expire?", "36 months"),
    Fact("faq.html", None, "International orders ship from our distribution centre in Rotterdam.",
         "Where do international orders ship from?", "Rotterdam"),
    # notes.txt
    Fact("notes.txt", None, "The sourdough starter needs feeding with rye flour every twelve hours.",
         "How often does the sourdough starter need feeding?", "every twelve hours"),
    Fact("notes.txt", None, "Aunt Miriam's birthday dinner is booked at the restaurant Blue Heron.",
         "Which restaurant is booked for Aunt Miriam's birthday dinner?", "Blue Heron"),
    Fact("notes.txt", None, "The spare key for the cabin is hidden under the third stone of the garden path.",
         "Where is the spare key for the cabin hidden?", "third stone of the garden path"),
    Fact("notes.txt", None, "The car needs new winter tyres of size 205/55 R16.",
         "What size are the winter tyres for the car?", "205/55 R16"),
    # uploader.py (source code)
    Fact("uploader.py", None, "CODE:MAX_UPLOAD_RETRIES = 7  # failed uploads are retried at most 7 times",
         "How many times are failed uploads retried?", "retried at most 7 times"),
    Fact("uploader.py", None, "CODE:SETTINGS_FILE = '~/.config/flashsync/settings.toml'  # the configuration file",
         "Where is the configuration file?", "settings.toml"),
    Fact("uploader.py", None, "CODE:DEFAULT_TIMEOUT_SECONDS = 45  # network timeout of the upload connection",
         "What is the network timeout of the upload connection?", "DEFAULT_TIMEOUT_SECONDS = 45"),
    # changelog.md
    Fact("changelog.md", None, "Version 2.4 removed support for the legacy Falcon protocol.",
         "Which version removed support for the Falcon protocol?", "Version 2.4 removed"),
    Fact("changelog.md", None, "Version 2.5 added resumable downloads over HTTP range requests.",
         "What did version 2.5 add?", "resumable downloads"),
    Fact("changelog.md", None, "Version 2.6 fixed a crash when the disk was full during checkout.",
         "What crash was fixed in version 2.6?", "disk was full during checkout"),
]

# near misses: they share the questions' rarest words but do not answer them
DISTRACTORS = [
    ("archive.pdf", 1, "The Velmora bridge appears on several old postcards sold in the museum shop."),
    ("archive.pdf", 2, "The Orlin observatory was renovated after a storm damaged its dome."),
    ("archive.pdf", 3, "The cafeteria once served soup on Mondays, before the menu changed."),
    ("archive.pdf", 4, "Membership of the hiking club is free for new employees."),
    ("archive.pdf", 5, "The water tower was painted green in the spring."),
    ("archive.pdf", 6, "The board meets in the north wing on the first Monday of each month."),
    ("other.txt", None, "Version 2.3 improved the speed of the checkout page."),
    ("other.txt", None, "Version 2.7 will drop the old configuration format."),
    ("other.txt", None, "Gift cards cannot be refunded."),
    ("other.txt", None, "The treasurer of the chess club is elected every two years."),
    ("other.txt", None, "The sync daemon writes its log files to the data folder."),
    ("other.txt", None, "Uploads of large snapshots can take a long time on slow networks."),
    ("changelog.md", None, "Version 2.2 added a dark theme to the settings window."),
    ("faq.html", None, "Orders within the country ship from the local store."),
    ("report.pdf", 2, "The Riga warehouse was expanded with a second loading dock."),
]

# filler vocabulary per file: shares the questions' words so BM25 has to rank
_THEMES = {
    "handbook.pdf": ("office bridge cafeteria floor room desk permit parking week employees visitors security "
                     "approval director team building wing session schedule").split(),
    "report.pdf": ("revenue segment warehouse lease customer subscription board share emissions site growth "
                   "quarter year costs market sales").split(),
    "archive.pdf": ("archive bridge revenue board warehouse observatory telescope treasurer fundraiser parking "
                    "cafeteria soup hackathon").split(),
    "minutes.docx": ("committee member treasurer fundraiser hall fees newsletter term meeting budget server "
                     "volunteer").split(),
    "guide.md": "daemon port snapshots log files upload cipher command configuration sync backup".split(),
    "faq.html": "orders refunds support gift cards shipping returns delivery weekdays customers".split(),
    "notes.txt": "dinner birthday cabin key garden car tyres flour recipe shopping weekend".split(),
    "changelog.md": "version release support protocol downloads crash fixed added removed checkout".split(),
    "other.txt": "version crash support orders port server dinner refund bridge treasurer".split(),
}
_VERBS = ("reviewed", "discussed", "updated", "planned", "checked", "moved", "described", "listed", "shared",
          "improved", "noted", "prepared")
_ADJS = ("new", "old", "regional", "weekly", "main", "shared", "usual", "local", "spare", "annual", "small")


def filler(theme: str, rng: random.Random, n_sentences: int) -> str:
    words = _THEMES[theme]
    out = []
    for _ in range(n_sentences):
        a, b = rng.sample(words, 2)
        out.append(f"The {rng.choice(_ADJS)} {a} {rng.choice(_VERBS)} the {rng.choice(_ADJS)} {b} "
                   f"with the {rng.choice(words)} team.")
    return " ".join(out)


def _paragraphs_for(file: str, page: int | None, rng: random.Random, n_filler: int = 4) -> list[str]:
    facts = [f.sentence for f in FACTS if f.file == file and f.page == page]
    facts += [d for f, pg, d in DISTRACTORS if f == file and pg == page]
    paras = [filler(file, rng, rng.randint(3, 6)) for _ in range(n_filler)]
    for s in facts:
        # TABLE:/CODE: facts are laid out by the writer of their format, without filler
        text = s if s.startswith(("TABLE:", "CODE:")) else f"{filler(file, rng, 1)} {s} {filler(file, rng, 1)}"
        paras.insert(rng.randint(0, len(paras)), text)
    return paras


def _write_pdf(path: Path, name: str, n_pages: int, rng: random.Random, n_filler: int = 5) -> None:
    from fpdf import FPDF

    class _PDF(FPDF):
        def footer(self) -> None:
            self.set_y(-15)
            self.set_font("Helvetica", size=8)
            self.cell(0, 10, f"Page {self.page_no()}", align="C")

    pdf = _PDF()
    pdf.set_auto_page_break(False)
    for page in range(1, n_pages + 1):
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 14)
        pdf.cell(0, 10, f"{Path(name).stem.title()} - section {page}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=10)
        for para in _paragraphs_for(name, page, rng, n_filler):
            pdf.multi_cell(0, 5, para, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(3)
    pdf.output(str(path))


def _write_docx(path: Path, rng: random.Random) -> None:
    import docx

    d = docx.Document()
    d.add_heading("Committee meeting minutes", 0)
    rows = []
    for i, para in enumerate(_paragraphs_for("minutes.docx", None, rng, 12)):
        if i % 3 == 0:
            d.add_heading(f"Agenda item {i // 3 + 1}", 2)
        if para.startswith("TABLE:"):
            rows.append(para[len("TABLE:"):].split("|"))
            continue
        d.add_paragraph(para)
    d.add_heading("Equipment", 2)
    t = d.add_table(rows=1, cols=3)
    for cell, text in zip(t.rows[0].cells, ("Name", "Role", "Location"), strict=True):
        cell.text = text
    for row in [["Osprey", "mail server", "second floor closet"]] + rows:
        for cell, text in zip(t.add_row().cells, row, strict=True):
            cell.text = text
    d.save(str(path))


def _markdown(name: str, title: str, rng: random.Random) -> str:
    lines = [f"# {title}", ""]
    for i, para in enumerate(_paragraphs_for(name, None, rng, 10)):
        if i % 2 == 0:
            lines += [f"## Part {i // 2 + 1}", ""]
        if para.startswith("CODE:"):
            intro, code = para[len("CODE:"):].split("|")
            lines += [intro, "", "```bash", code, "```", ""]
            continue
        lines += [para, ""]
    lines += ["```python", "def example():", "    return 'a code block'", "", "", "print(example())", "```", ""]
    return "\n".join(lines)


def _html(rng: random.Random) -> str:
    body = []
    for i, para in enumerate(_paragraphs_for("faq.html", None, rng, 10)):
        if i % 2 == 0:
            body.append(f"<h2>Question group {i // 2 + 1}</h2>")
        body.append(f"<p>{para}</p>")
    return ("<!DOCTYPE html>\n<html><head><title>Shop FAQ</title>\n<style>p { color: red; }</style>\n"
            "<script>var tracking = 'do not index this';</script></head>\n<body>\n<nav><ul><li>Home</li>"
            "<li>Shop</li></ul></nav>\n" + "\n".join(body) +
            "\n<pre><code>curl https://example.invalid/api/orders</code></pre>\n</body></html>\n")


def _text(name: str, rng: random.Random, n: int = 10) -> str:
    return "\n\n".join(_wrap(p) for p in _paragraphs_for(name, None, rng, n)) + "\n"


def _wrap(text: str, width: int = 78) -> str:
    lines, cur = [], ""
    for w in text.split():
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return "\n".join(lines + [cur])


def _python(rng: random.Random) -> str:
    consts = [f.sentence[5:] for f in FACTS if f.file == "uploader.py"]
    out = ['"""Upload snapshots to the sync server."""', "", "import time", ""]
    out += consts + [""]
    for i in range(4):
        out += ["", f"def step_{i}(session, payload):", f'    """{filler("guide.md", rng, 1)}"""',
                "    result = session.send(payload)", "", "    if not result.ok:",
                "        raise RuntimeError(result.error)", "    return result", ""]
    out += ["", "class Uploader:", '    """Sends snapshots, retrying failed uploads."""', "",
            "    def __init__(self, session):", "        self.session = session", "",
            "    def upload(self, payload):", "        for attempt in range(MAX_UPLOAD_RETRIES):",
            "            try:", "                return step_0(self.session, payload)",
            "            except RuntimeError:", "                time.sleep(0.25 * 2 ** attempt)",
            "        raise RuntimeError('upload failed')", ""]
    return "\n".join(out)


BROKEN = {
    "damaged.pdf": "not a readable PDF",
    "locked.pdf": "password-protected",
    "scan.pdf": "no text layer",
    "damaged.docx": "not a readable DOCX",
    "binary.txt": "binary",
}


def _write_broken(root: Path) -> None:
    from fpdf import FPDF
    from pypdf import PdfWriter

    (root / "damaged.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\nthis is not a pdf body\n")
    src = root / "_locked_src.pdf"
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.cell(0, 10, "Secret salary table")
    pdf.output(str(src))
    w = PdfWriter(clone_from=str(src))
    w.encrypt("hunter2", algorithm="RC4-128")
    w.write(str(root / "locked.pdf"))
    src.unlink()
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 60, style="F")  # an "image" without any text
    pdf.output(str(root / "scan.pdf"))
    (root / "damaged.docx").write_bytes(b"PK\x03\x04 not really a zip archive")
    (root / "binary.txt").write_bytes(bytes(range(256)) * 4)


def build_corpus(root: Path, seed: int = 7, broken: bool = True) -> list[Question]:
    """Write the corpus under root (sub-folders included); returns the questions."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "pdf").mkdir(exist_ok=True)
    (root / "notes").mkdir(exist_ok=True)
    (root / "src").mkdir(exist_ok=True)
    _write_pdf(root / "pdf" / "handbook.pdf", "handbook.pdf", 8, rng)
    _write_pdf(root / "pdf" / "report.pdf", "report.pdf", 5, rng)
    _write_pdf(root / "pdf" / "archive.pdf", "archive.pdf", 6, rng)
    _write_docx(root / "minutes.docx", rng)
    (root / "guide.md").write_text(_markdown("guide.md", "Flashsync guide", rng))
    (root / "changelog.md").write_text(_markdown("changelog.md", "Changelog", rng))
    (root / "faq.html").write_text(_html(rng))
    (root / "notes" / "notes.txt").write_text(_text("notes.txt", rng))
    (root / "notes" / "other.txt").write_text(_text("other.txt", rng, 20))
    (root / "src" / "uploader.py").write_text(_python(rng))
    if broken:
        _write_broken(root / "notes")
    return [Question(f.question, f.answer, f.file, f.page) for f in FACTS]


def corpus_words() -> set[str]:
    """Every word the corpus writer can put in a file (for the test embedding model)."""
    text = " ".join([f.sentence + " " + f.question for f in FACTS] + [d for _, _, d in DISTRACTORS] +
                    [" ".join(ws) for ws in _THEMES.values()] + list(_VERBS) + list(_ADJS) +
                    ["the with team page section handbook report archive minutes guide changelog faq notes "
                     "other uploader agenda item part question group equipment name role location def return "
                     "result session payload class self"])
    return set(re.findall(r"[A-Za-z0-9]+", text))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--scale", type=int, default=1, help="write N copies (different seeds) in sub-folders")
    args = ap.parse_args(argv)
    for i in range(args.scale):
        build_corpus(args.out / f"copy{i:03d}" if args.scale > 1 else args.out, seed=7 + i, broken=i == 0)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
