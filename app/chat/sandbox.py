"""Rendering an untrusted chat template with a time limit, a size limit and Stop.

A GGUF's `tokenizer.chat_template` is Jinja from the file: it renders in
Jinja's immutable sandbox (no attribute tricks, no mutation of lists or
dicts), and on top of that under three limits, all in this module:

- Time and Stop: Jinja compiles a template to Python code (filename
  "<template>"), so a line-event trace on the rendering thread sees every
  loop iteration. It raises once the deadline passes or the cancel event is
  set; nested loops otherwise run for good and Stop never reaches them.
- Size: every way a template can build a big value in one C call is checked
  before it runs: `*`, `+`, `**`, `%` (intercepted binary operators), call
  arguments and results (macros, methods), filters, and stores into a
  `namespace()` (where `~` concatenation grows a value across loop turns).
  The output is counted as it streams. A huge string otherwise ends in a
  MemoryError with an empty message.
- Whatever still runs out of memory or recursion is said in words.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from app.errors import FlashDeskError

RENDER_SECONDS = 2.0  # real chat templates render in milliseconds
# the template's own text: message contents are put in afterwards, so a prompt's markup is small
RENDER_MAX_CHARS = 1 << 20
MAX_INT_BITS = 1 << 16  # an integer past this is no prompt's business (and its arithmetic can take minutes)
_TEMPLATE_FILE = "<template>"  # the filename Jinja compiles templates under
_WIDTH_FILTERS = ("center", "indent", "wordwrap", "truncate")  # an int argument is a size in characters
_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")


class TemplateRenderError(FlashDeskError):
    """The model's chat template could not turn the conversation into a prompt; says why."""


class TemplateRenderCancelled(TemplateRenderError):
    """Stop was pressed while the template was rendering."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


class _Limits:
    def __init__(self, seconds: float, max_chars: int, cancel: threading.Event | None):
        self.seconds, self.max_chars, self.cancel = seconds, max_chars, cancel
        self.deadline = time.monotonic() + seconds

    def too_big(self, n: int, what: str) -> TemplateRenderError:
        return TemplateRenderError(f"the model's chat template builds {what} of {n:,} characters or items "
                                   f"(the limit is {self.max_chars:,}): it is broken or hostile, not a prompt format")

    def check_size(self, value: Any, what: str = "a value") -> Any:
        if _size(value) > self.max_chars:
            raise self.too_big(_size(value), what)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise self.too_many_bits(value.bit_length())
        return value

    def too_many_bits(self, bits: int) -> TemplateRenderError:
        return TemplateRenderError(f"the model's chat template computes an integer of about {bits:,} bits "
                                   f"(the limit is {MAX_INT_BITS:,}): it is broken or hostile")

    def check_time(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise TemplateRenderCancelled("stopped while the model's chat template was rendering the prompt")
        if time.monotonic() > self.deadline:
            raise TemplateRenderError(f"the model's chat template did not finish within {self.seconds:g} s "
                                      f"(a loop that runs too long or forever): it is broken or hostile")

    def check_binop(self, op: str, left: Any, right: Any) -> None:
        """The size of `left op right`, before it is computed."""
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if _size(seq) and isinstance(n, int) and _size(seq) * n > self.max_chars:
                    raise self.too_big(_size(seq) * n, "a repeated value")
            if isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise self.too_many_bits(left.bit_length() + right.bit_length())
        elif op == "+" and _size(left) + _size(right) > self.max_chars:
            raise self.too_big(_size(left) + _size(right), "a concatenation")
        elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * left.bit_length() > MAX_INT_BITS:
            raise self.too_many_bits(right * left.bit_length())
        elif op == "%" and isinstance(left, str):
            args = right if isinstance(right, tuple) else (right,)
            specs = [w for m in _PRINTF_WIDTH.finditer(left) for w in m.groups() if w]
            widths = [int(w) for w in specs if w != "*"]
            if "*" in specs:  # a width taken from the arguments
                widths += [a for a in args if isinstance(a, int)]
            if widths and max(widths) > self.max_chars:
                raise self.too_big(max(widths), "a formatted field")

    def trace(self, frame: FrameType, event: str, arg: Any) -> Callable | None:
        """sys.settrace's global function: line events only inside the template's own code."""
        return self._trace_template if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def _trace_template(self, frame: FrameType, event: str, arg: Any) -> Callable:
        # raised from a line of the template itself, never inside Jinja's runtime (which may catch errors)
        if event == "line":
            self.check_time()
        return self._trace_template


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, limits: _Limits):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.limits = limits
        self.filters = {name: self._limited_filter(name, f) for name, f in self.filters.items()}

        class LimitedNamespace(Namespace):
            def __setitem__(self, name: str, value: Any) -> None:  # {% set ns.x = ... %}
                super().__setitem__(name, limits.check_size(value, "a namespace value"))

        self.globals["namespace"] = LimitedNamespace

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.limits.check_binop(operator, left, right)
        return self.limits.check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # Jinja's signature
        for a in (*args, *kwargs.values()):
            __self.limits.check_size(a, "an argument")
        return __self.limits.check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def _limited_filter(self, name: str, f: Callable) -> Callable:
        limits = self.limits

        @functools.wraps(f)  # keeps Jinja's pass_context/pass_environment marks
        def limited(*args: Any, **kwargs: Any) -> Any:
            values = (*args, *kwargs.values())
            if name in _WIDTH_FILTERS:
                for a in values:
                    if isinstance(a, int) and not isinstance(a, bool) and a > limits.max_chars:
                        raise limits.too_big(a, f"a `{name}` width")
            if name == "join":  # join(eval_ctx, value, d=""): the joined size, before joining
                items = args[1] if len(args) > 1 and isinstance(args[1], list | tuple) else ()
                sep = args[2] if len(args) > 2 else kwargs.get("d", "")
                total = sum(_size(x) for x in items) + len(items) * _size(sep)
                if total > limits.max_chars:
                    raise limits.too_big(total, "a join")
            return limits.check_size(f(*args, **kwargs), f"the `{name}` filter's result")

        return limited


def render_sandboxed(template: str, context: dict[str, Any], *, cancel: threading.Event | None = None,
                     seconds: float = RENDER_SECONDS, max_chars: int = RENDER_MAX_CHARS,
                     helpers: dict[str, Callable] | None = None) -> str:
    """The template rendered with `context` under the limits in the module doc; raises
    TemplateRenderError (TemplateRenderCancelled when `cancel` is set) saying why."""
    limits = _Limits(seconds, max_chars, cancel)
    env = _LimitedEnvironment(limits)
    env.globals.update(helpers or {})
    previous = sys.gettrace()  # a debugger's or coverage's: given back afterwards
    sys.settrace(limits.trace)
    try:
        parts, total = [], 0
        for chunk in env.from_string(template).generate(**context):
            total += len(chunk)
            if total > max_chars:
                raise limits.too_big(total, "a prompt")
            parts.append(chunk)
        return "".join(parts)
    except TemplateRenderError:
        raise
    except MemoryError:
        raise TemplateRenderError("the model's chat template needs more memory than there is (it builds a huge "
                                  "value): it is broken or hostile") from None
    except RecursionError:
        raise TemplateRenderError("the model's chat template recurses too deeply: it is broken or hostile") from None
    except (TemplateError, Exception) as e:  # a sandbox violation or a broken template
        raise TemplateRenderError(f"the model's chat template could not be rendered: {type(e).__name__}: "
                                  f"{str(e)[:300]}") from e
    finally:
        sys.settrace(previous)
