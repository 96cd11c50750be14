"""Hostile chat templates (issue 16, point 3): real Jinja rendered by the app's PromptFormat, under the
sandbox's time limit, size limit and the reply's Stop."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from app.chat.format import ChatMessage, PromptFormat, TemplateRenderCancelled, TemplateRenderError
from app.chat.sandbox import RENDER_MAX_CHARS, RENDER_SECONDS

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# three nested loops of 100,000 (the sandbox's range limit): 10^15 turns, forever in practice
NESTED_FOREVER = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                  "{% endfor %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}")
MESSAGES = [ChatMessage("user", "What is the capital of France?")]
SLACK_S = 2.0  # this machine is shared with a benchmark: the check itself runs at every template line


def test_a_real_template_still_renders_and_the_trace_is_given_back() -> None:
    before = sys.gettrace()
    text = PromptFormat("chatml", CHATML).render(MESSAGES + [ChatMessage("assistant", "Paris."),
                                                             ChatMessage("user", "And Italy?")])
    assert text == ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis."
                    "<|im_end|>\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n")
    assert sys.gettrace() is before
    # a message's content is put in after rendering: a long document is not the template's output
    long = "word " * (RENDER_MAX_CHARS // 2)
    assert PromptFormat("chatml", CHATML).render([ChatMessage("user", long)]).count("word") == RENDER_MAX_CHARS // 2


def test_nested_infinite_loops_end_at_the_time_limit_with_a_clear_message() -> None:
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError) as ei:
        PromptFormat("t", NESTED_FOREVER).render(MESSAGES)
    took = time.monotonic() - t0
    assert not isinstance(ei.value, TemplateRenderCancelled)
    assert str(ei.value) == (f"the model's chat template did not finish within {RENDER_SECONDS:g} s (a loop that "
                             f"runs too long or forever): it is broken or hostile")
    assert RENDER_SECONDS <= took < RENDER_SECONDS + SLACK_S


def test_stop_interrupts_a_template_stuck_in_a_loop() -> None:
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()  # Stop, pressed from another thread while the template loops
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderCancelled, match="stopped while the model's chat template was rendering"):
        PromptFormat("t", NESTED_FOREVER).render(MESSAGES, cancel=cancel)
    assert 0.2 <= time.monotonic() - t0 < RENDER_SECONDS  # well before the time limit would end it


@pytest.mark.parametrize("template, says", [
    # doubling a string across loop turns with `~` into a namespace: 2^64 characters, a MemoryError before
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "builds a namespace value of 2,097,152 characters or items"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     "builds a concatenation of 2,097,152 characters or items"),
    ("{{ 'x' * 10**12 }}", "builds a repeated value of 1,000,000,000,000 characters or items"),
    ("{{ 'ab' | center(10**11) }}", "builds a `center` width of 100,000,000,000 characters or items"),
    ("{{ (['x' * 100000] * 100000) | join(',') }}", "builds a join of 10,000,100,000 characters or items"),
    ("{{ '%0999999999d' % 7 }}", "builds a formatted field of 999,999,999 characters or items"),
    ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "builds a prompt of 1,049,000 characters"),
    ("{{ 2 ** 1000000 }}", "computes an integer of about 2,000,000 bits"),
])
def test_a_template_building_a_huge_value_is_refused_in_words(template: str, says: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError, match=says) as ei:
        PromptFormat("t", template).render(MESSAGES)
    assert "broken or hostile" in str(ei.value) or "limit is" in str(ei.value)
    assert time.monotonic() - t0 < RENDER_SECONDS + SLACK_S


def test_a_template_error_names_the_problem() -> None:
    with pytest.raises(TemplateRenderError, match="refused the conversation: no system role"):
        PromptFormat("t", "{{ raise_exception('no system role') }}").render(MESSAGES)
    with pytest.raises(TemplateRenderError, match="could not be rendered: TemplateSyntaxError"):
        PromptFormat("t", "{% for %}").render(MESSAGES)
    with pytest.raises(TemplateRenderError, match="could not be rendered: SecurityError"):
        PromptFormat("t", "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render(MESSAGES)
